"""One benchmark run end to end: service vs the naive baseline, on the same machine, same texts.

1. The naive baseline first, in its own process (so its GPU memory is gone before the service
   starts) with the same environment and texts.
2. Start ``python -m service`` with the environment given (e.g. ``HYMT_LOAD_FORMAT=dummy``), and
   time process start -> ready (``/health`` 200) -> first translation.
3. Throughput: the load generator, closed loop, through HTTP.
4. Lone-request latency: one client, one request at a time.
5. Optionally overload (``--flood-requests``, ``--goodput-rate``): ``loadtests.overload``'s flood
   with ``/health`` polled, and goodput under a deadline.
   Beside the throughput run and each flood, the CPU seconds the service's processes spent, by
   role (``loadtests.cpu_time``: ``throughput_cpu_s``, ``flood_cpu_s``, ``flood_warm_cpu_s``).
6. Stop the service (SIGTERM). ``LABEL.json`` is rewritten after every step, so a run cut short by
   a time limit still leaves what it measured, the ratio as soon as both sides exist.

    python -m loadtests.bench --out results/ --requests 1024 --concurrency 1024 \\
        --env HYMT_LOAD_FORMAT=dummy --env HYMT_CACHE_SIZE=0
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests import cpu_time, loadgen, overload
from loadtests.timeline import Timeline, summarize


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# A cold start compiles a decode step per batch-size bucket: minutes for the 30B's layers.
START_TIMEOUT_S = 600.0


def cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` -> ``{0, 1, 2, 3, 8}`` (taskset's list form)."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def start_service(
    env: dict[str, str], log: Path, cpus: set[int] | None = None
) -> tuple[subprocess.Popen[bytes], str, dict[str, float]]:
    """Start ``python -m service`` and wait until it is ready; ``cpus``: the cores it (and every
    process it starts) may run on."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    environment = {**os.environ, **env, "HYMT_HOST": "127.0.0.1", "HYMT_PORT": str(port)}
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service"],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=None if cpus is None else partial(os.sched_setaffinity, 0, cpus),
        )
    timings: dict[str, float] = {}
    deadline = started + START_TIMEOUT_S
    while True:
        if process.poll() is not None or time.perf_counter() > deadline:
            stop_service(process)
            raise RuntimeError(f"the service did not become ready: {log.read_text()[-4000:]}")
        try:
            # trust_env=False: a proxy configured in the environment must not see loopback calls.
            live = httpx.get(f"{url}/live", timeout=2, trust_env=False).status_code
            if live == 503:  # the engine failed to load
                stop_service(process)
                raise RuntimeError(f"the engine failed to start: {log.read_text()[-4000:]}")
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    timings["start_to_ready_s"] = round(time.perf_counter() - started, 2)
    response = httpx.post(
        f"{url}/translate",
        json={"text": "The first translation.", "target_lang": "de"},
        timeout=600,
    )
    response.raise_for_status()
    timings["start_to_first_translation_s"] = round(time.perf_counter() - started, 2)
    return process, url, timings


def stop_service(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def metric(url: str, name: str) -> float | None:
    return value_of(httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text, name)


def gpu_memory(url: str) -> dict[str, float]:
    """The service's ``hymt_gpu_memory_bytes`` by kind (allocated, reserved, their peaks, the
    KV cache): where an operator's memory budget went."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    found = re.findall(r'^hymt_gpu_memory_bytes\{kind="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {kind: float(value) for kind, value in found}


def value_of(text: str, name: str) -> float | None:
    """The first sample of metric ``name`` in a /metrics text."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


class RunningSampler:
    """``hymt_engine_running_texts`` (and the device's busy share, where the engine reports
    it) every 200 ms in a thread, from when the measured requests are sent (the first sample
    that sees texts in flight) until the block ends."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._samples: list[tuple[float, int, int, float | None]] = []
        self._totals: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=10, trust_env=False) as client:
            while not self._stop.is_set():
                text = client.get("/metrics").text
                running = value_of(text, "hymt_engine_running_texts") or 0
                in_flight = value_of(text, "hymt_in_flight_texts") or 0
                busy = value_of(text, "hymt_engine_device_busy_ratio")
                now = time.perf_counter()
                self._samples.append((now, int(running), int(in_flight), busy))
                self._totals.append((now, engine_totals(text)))
                self._stop.wait(0.2)  # each scrape is work for the loop being measured

    def timeline(self, duration_s: float) -> Timeline:
        """From the first sample with more in flight than the loadgen's warm-up (one at a time)
        until the end of the measured run."""
        start = next((t for t, _, in_flight, _ in self._samples if in_flight > 1), None)
        if start is None:
            return summarize([], duration_s)
        kept = [sample for sample in self._samples if sample[0] >= start]
        return summarize(
            [(t - start, running) for t, running, _, _ in kept],
            duration_s,
            [(t - start, busy) for t, _, _, busy in kept if busy is not None],
            [(t - start, totals) for t, totals in self._totals if t >= start and totals],
        )


def engine_totals(text: str) -> dict[str, float]:
    """The engine's running totals in a /metrics text: its step loop's seconds by part and
    (``device``) its accelerator's seconds, where it reports them."""
    found = dict(re.findall(r'^hymt_engine_loop_seconds_total\{part="(\w+)"\} (\S+)$', text, re.M))
    totals = {part: float(value) for part, value in found.items()}
    device = value_of(text, "hymt_engine_device_seconds_total")
    if totals and device:
        totals["device"] = device
    return totals


# The loop-lag buckets reported: a refusal that waits 5-10 ms for its loop is as late as the
# flood's refusals are beyond the front door's own.
_LAG_BOUNDS = ("0.005", "0.01", "0.02", "0.05", "0.1")


def stalls(url: str) -> dict[str, float]:
    return stalls_of(httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text)


def stalls_of(text: str) -> dict[str, float]:
    """The API process's stall counters in a /metrics text (``service.frontend.stalls``): loop-lag
    samples, those over 5/10/20/50/100 ms, and collector passes and seconds by generation."""
    figures: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "hymt_event_loop_lag_seconds_count":
                figures["lag_samples"] = sample.value
            elif (
                sample.name == "hymt_event_loop_lag_seconds_bucket" and labels["le"] in _LAG_BOUNDS
            ):
                figures[f"lag_upto_{labels['le']}"] = sample.value
            elif sample.name in ("hymt_gc_pause_seconds_count", "hymt_gc_pause_seconds_sum"):
                kind = "passes" if sample.name.endswith("count") else "seconds"
                figures[f"gc{labels['generation']}_{kind}"] = sample.value
    for bound in _LAG_BOUNDS:
        figures[f"lag_over_{bound}"] = figures.get("lag_samples", 0) - figures.pop(
            f"lag_upto_{bound}", 0
        )
    return figures


def _since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: round(value - before.get(key, 0.0), 6) for key, value in after.items()}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--lone-requests", type=int, default=8)
    parser.add_argument("--baseline-requests", type=int, default=16, help="0 skips the baseline")
    parser.add_argument("--label", default="service")
    parser.add_argument("--flood-requests", type=int, default=0, help="0 skips the flood")
    parser.add_argument("--flood-processes", type=int, default=4)
    parser.add_argument("--goodput-rate", type=float, default=0, help="0 skips goodput")
    parser.add_argument("--goodput-deadline", type=float, default=10.0)
    parser.add_argument("--goodput-duration", type=float, default=20.0)
    parser.add_argument(
        "--service-cpus", type=cpu_list, help='cores for the service, e.g. "8-15" (taskset form)'
    )
    parser.add_argument(
        "--client-cpus",
        type=cpu_list,
        help="cores for this process and its load generators once the service is up: a flood's "
        "clients apart from the service, as on another machine",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(item.split("=", 1) for item in args.env)
    result: dict[str, object] = {"label": args.label, "env": env}

    report = args.out / f"{args.label}.json"

    def save() -> None:
        naive = result.get("baseline")
        served = result.get("throughput")
        if isinstance(naive, dict) and isinstance(served, dict):
            result["ratio_vs_baseline"] = round(
                served["output_tokens_per_s"] / naive["output_tokens_per_s"], 1
            )
        report.write_text(json.dumps(result, indent=2) + "\n")

    if args.baseline_requests:
        result["baseline"] = run_baseline(env, args.baseline_requests, args.out / "baseline.json")
        save()
    process, url, timings = start_service(env, args.out / f"{args.label}.log", args.service_cpus)
    result.update(timings)
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
        result["cpus"] = {
            "service": sorted(args.service_cpus or []),
            "client": sorted(args.client_cpus),
        }
    try:
        result["weights_bytes"] = metric(url, "hymt_model_weights_bytes")
        result["load_seconds"] = metric(url, "hymt_model_load_seconds")
        save()
        engine = cpu_time.engine_pid(args.out / f"{args.label}.log")
        with RunningSampler(url) as sampler, cpu_time.Phase(process.pid, engine) as cpu:
            throughput = loadgen.main(
                ["--url", url, "--requests", str(args.requests), "--concurrency",
                 str(args.concurrency), "--warmup", "8", "--quiet"]
            )  # fmt: skip
        result["throughput"] = asdict(throughput)
        result["throughput_cpu_s"] = cpu.spent
        result["throughput_timeline"] = asdict(sampler.timeline(throughput.duration_s))
        save()
        lone = loadgen.main(
            ["--url", url, "--requests", str(args.lone_requests), "--concurrency", "1",
             "--warmup", "2", "--quiet", "--seed", "7"]
        )  # fmt: skip
        result["lone"] = asdict(lone)
        result["gpu_memory_allocated_bytes"] = metric(url, "hymt_gpu_memory_bytes")
        result["gpu_memory_bytes"] = gpu_memory(url)
        save()
        if args.flood_requests:
            before = stalls(url)
            with cpu_time.Phase(process.pid, engine) as cpu:
                flood = overload.flood(url, args.flood_requests, args.flood_processes)
            result["flood"] = asdict(flood)
            result["flood_cpu_s"] = cpu.spent
            between = stalls(url)
            result["flood_stalls"] = _since(before, between)
            save()
            with cpu_time.Phase(process.pid, engine) as cpu:
                warm = overload.flood(url, args.flood_requests, args.flood_processes, warm=True)
            result["flood_warm"] = asdict(warm)
            result["flood_warm_cpu_s"] = cpu.spent
            result["flood_warm_stalls"] = _since(between, stalls(url))
            save()
            result["refusals_server_side_ms"] = refusal_times(args.out / f"{args.label}.log")
            save()
        if args.goodput_rate:
            result["goodput"] = asdict(
                overload.goodput(
                    url, args.goodput_rate, args.goodput_duration, args.goodput_deadline
                )
            )
            save()
    finally:
        stop_service(process)
    print(json.dumps(result, indent=2))
    return result


def refusal_times(log: Path) -> dict[str, object]:
    """The 429s in the service's access log, first byte in to response start: the service's own
    share of a refusal (client-side times add queueing on both ends), and how many each API
    process answered (how evenly the kernel spread the connections). Refusals at the door are
    logged as one line a second with their count and p50/p99/max: those are reported per line
    (``door``), the others request by request."""
    times: list[float] = []
    by_process: dict[str, int] = {}
    door: list[dict[str, object]] = []
    for line in log.read_text(errors="replace").splitlines():
        if '"service.frontend.access"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("status") != 429:
            continue
        process = str(entry.get("process_kind"))
        count = int(entry.get("count", 1))
        by_process[process] = by_process.get(process, 0) + count
        if entry.get("message") == "refused at the door":
            door.append(
                {key: entry[key] for key in ("count", "duration_ms_p50", "duration_ms_p99",
                                             "duration_ms_max")}
            )  # fmt: skip
        elif "duration_ms" in entry:
            times.append(float(entry["duration_ms"]))
    return {
        "by_process": dict(sorted(by_process.items())),
        "count": sum(by_process.values()),
        "door": door,
        "door_p99_max": max((float(str(d["duration_ms_p99"])) for d in door), default=0.0),
        "past_the_door": len(times),
        "p50": loadgen.percentile(times, 0.5),
        "p99": loadgen.percentile(times, 0.99),
        "max": max(times, default=0.0),
    }


def run_baseline(env: dict[str, str], requests: int, report: Path) -> dict[str, object]:
    """``loadtests.baseline`` in a child process with the service's environment."""
    subprocess.run(
        [sys.executable, "-m", "loadtests.baseline", "--requests", str(requests),
         "--seed", "3", "--report", str(report)],
        env={**os.environ, **env},
        check=True,
    )  # fmt: skip
    loaded: dict[str, object] = json.loads(report.read_text())
    return loaded


if __name__ == "__main__":
    main()
