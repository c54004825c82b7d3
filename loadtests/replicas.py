"""Replicas behind the shipped nginx: N replicas against one, in one command, on one machine.

1. Redis on loopback (unless ``--no-redis``): the replicas share rate limits, quotas and the
   result cache through it, as ``deploy/compose.replicas.yaml`` runs them.
2. ``--replicas`` services (``python -m service`` with the ``--env`` settings), started one
   after the other (the later ones reuse the first one's compile cache), replica i on the i-th
   GPU of ``--devices`` (its ``CUDA_VISIBLE_DEVICES``), each timed to ready.
3. The shipped nginx in front of all of them (``loadtests.stack``).
4. Throughput through nginx: the load generator, closed loop, ``--concurrency`` clients spread
   over ``--sources`` loopback addresses (nginx limits each address to 20 requests/s: one
   address would be one user); the share of the requests and of the generated tokens each
   replica served, from its own ``/metrics`` (the load generator's 8 warm-up requests included).
   The result cache is off (``HYMT_CACHE_SIZE=0`` unless ``--env`` sets it): both phases send
   the same texts.
5. A flood through nginx (``loadtests.overload``): ``--flood-requests`` at once from the same
   addresses, the time to each 429 and ``/health`` (through nginx) polled meanwhile.
6. Every replica but the first stopped, nginx started again in front of it alone: 4 and 5 again.
7. Output tokens/s of N replicas over one. ``replicas.json`` is rewritten after every step.

    python -m loadtests.replicas --out results --replicas 2 --devices 0,1 \\
        --requests 2048 --concurrency 2048 --env HYMT_LOAD_FORMAT=dummy
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests import loadgen, overload, stack
from loadtests.bench import start_service, stop_service


def served(metrics: str) -> dict[str, float]:
    """What one replica's ``/metrics`` says it served: answered ``POST /translate`` requests
    (status 200) and generated tokens."""
    figures = {"requests": 0.0, "generated_tokens": 0.0}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "hymt_requests_total"
                and labels.get("route") == "/translate"
                and labels.get("method") == "POST"
                and labels.get("status") == "200"
            ):
                figures["requests"] += sample.value
            elif sample.name == "hymt_generated_tokens_total":
                figures["generated_tokens"] += sample.value
    return figures


def shares(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Each replica's part of what all of them served between two readings."""
    done = [
        {key: a[key] - b.get(key, 0.0) for key in a} for b, a in zip(before, after, strict=True)
    ]
    totals = {key: sum(d[key] for d in done) for key in ("requests", "generated_tokens")}
    return [
        {
            **{key: int(value) for key, value in d.items()},
            "share_of_requests": round(d["requests"] / totals["requests"], 4)
            if totals["requests"]
            else 0.0,
            "share_of_tokens": round(d["generated_tokens"] / totals["generated_tokens"], 4)
            if totals["generated_tokens"]
            else 0.0,
        }
        for d in done
    ]


def _read(urls: list[str]) -> list[dict[str, float]]:
    return [served(httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text) for url in urls]


def phase(args: argparse.Namespace, nginx_url: str, urls: list[str]) -> dict[str, Any]:
    """Throughput with the replicas' shares, then the flood, through ``nginx_url``."""
    before = _read(urls)
    throughput = loadgen.main(
        ["--url", nginx_url, "--requests", str(args.requests), "--concurrency",
         str(args.concurrency), "--sources", str(args.sources), "--warmup", "8", "--quiet"]
    )  # fmt: skip
    result: dict[str, Any] = {
        "replicas": len(urls),
        "throughput": asdict(throughput),
        "served": shares(before, _read(urls)),
    }
    if args.flood_requests:
        flood = overload.flood(
            nginx_url, args.flood_requests, args.flood_processes, warm=True, sources=args.sources
        )
        result["flood"] = asdict(flood)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replicas", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for every replica")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--devices", default="", help="GPU per replica, e.g. 0,1 (unset: none)")
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=2048)
    parser.add_argument("--sources", type=int, default=128, help="client loopback addresses")
    parser.add_argument("--flood-requests", type=int, default=4096, help="0 skips the flood")
    parser.add_argument("--flood-processes", type=int, default=4)
    parser.add_argument("--nginx", default=stack.find_binary("nginx") or "nginx")
    parser.add_argument("--redis-server", default=stack.find_binary("redis-server") or "")
    parser.add_argument("--no-redis", action="store_true", help="replicas without shared state")
    args = parser.parse_args(argv)
    devices = [d for d in args.devices.split(",") if d]
    if devices and len(devices) != args.replicas:
        parser.error("--devices names one GPU per replica")
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(item.split("=", 1) for item in args.env)
    # Both phases send the same texts: with the result cache (local or in Redis) the second
    # would measure cache hits, not translations.
    env.setdefault("HYMT_CACHE_SIZE", "0")
    result: dict[str, Any] = {"env": env, "replicas": args.replicas, "devices": devices}
    report = args.out / "replicas.json"

    def save() -> None:
        report.write_text(json.dumps(result, indent=2) + "\n")

    redis = None
    nginx = None
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        if not args.no_redis:
            if not args.redis_server:
                parser.error("no redis-server found: give --redis-server, or --no-redis")
            redis = stack.start_redis(args.redis_server, stack.free_port(), args.out / "redis")
            env["HYMT_REDIS_URL"] = redis.url
        # One after the other: the later replicas find the first one's compiled kernels in the
        # shared data folder's compile cache instead of compiling the same graphs at once.
        timings = []
        for index in range(args.replicas):
            own = {**env, **({"CUDA_VISIBLE_DEVICES": devices[index]} if devices else {})}
            process, url, started = start_service(own, args.out / f"replica{index}.log")
            processes.append(process)
            urls.append(url)
            timings.append(started)
        result["start"] = timings
        save()
        addresses = [url.removeprefix("http://") for url in urls]
        nginx = stack.start_nginx(args.nginx, addresses, args.out / "nginx")
        result["all"] = phase(args, nginx.url, urls)
        save()
        if args.replicas > 1:
            for process in processes[1:]:
                stop_service(process)
            nginx.stop()
            nginx = stack.start_nginx(args.nginx, addresses[:1], args.out / "nginx-one")
            result["one"] = phase(args, nginx.url, urls[:1])
            many = result["all"]["throughput"]["output_tokens_per_s"]
            one = result["one"]["throughput"]["output_tokens_per_s"]
            result["ratio_all_over_one"] = round(many / one, 3) if one else None
            save()
    finally:
        if nginx is not None:
            nginx.stop()
        for process in processes:
            if process.poll() is None:
                stop_service(process)
        if redis is not None:
            redis.stop()
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
