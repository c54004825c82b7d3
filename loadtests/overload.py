"""Overload behaviour of a running service: how fast refusals come, whether probes stay fast,
and how much of what is admitted finishes inside its deadline.

- ``flood``: ``--requests`` requests sent at once (by ``--processes`` client processes, so the
  load generator's own event loop is not what is measured), while a separate process polls
  ``/health`` every 50 ms; ``--warm`` opens every connection before the flood, as a proxy's
  upstream keep-alive pool would have them open, so TCP setup is not what is timed. Reports the
  count per status, requests lost (no answer), time to 429 p50/p99 (send to answer, client
  side) and ``/health`` latency p50/p99/max during the flood.
- ``goodput``: open-loop arrivals at ``--rate`` per second for ``--duration`` seconds, each with
  ``X-Request-Timeout: --deadline``: the share of admitted requests (not refused with 429) that
  finished 200, the rest 504 or other.

    python -m loadtests.overload --url http://127.0.0.1:8000 flood --requests 4096 --processes 4
    python -m loadtests.overload --url http://127.0.0.1:8000 goodput --rate 80 --deadline 10
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from loadtests.loadgen import emit, percentile
from loadtests.texts import make_jobs


@dataclass
class FloodReport:
    warm_connections: bool
    requests: int
    answered: int
    lost: int
    by_status: dict[str, int]
    duration_s: float
    refusal_p50_ms: float
    refusal_p99_ms: float
    ok_p50_s: float
    health_polls: int
    health_p50_ms: float
    health_p99_ms: float
    health_max_ms: float
    health_not_200: dict[str, int] = field(default_factory=dict)


@dataclass
class GoodputReport:
    rate: float
    duration_s: float
    deadline_s: float
    requests: int
    by_status: dict[str, int]
    admitted: int
    finished_in_deadline: int
    goodput_share_of_admitted: float
    output_tokens_per_s: float


Outcomes = list[tuple[int, float]]


async def _burst(url: str, count: int, seed: int, warm: bool) -> Outcomes:
    jobs = make_jobs(count, seed=seed)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=timeout, trust_env=False
    ) as client:

        async def one(index: int) -> tuple[int, float]:
            job = jobs[index]
            started = time.perf_counter()
            try:
                async with client.post(
                    "/translate", json={"text": job.texts[0], "target_lang": job.target_lang}
                ) as response:
                    await response.read()
                    return response.status, time.perf_counter() - started
            except (aiohttp.ClientError, TimeoutError):
                return 0, time.perf_counter() - started

        if warm:
            # One open keep-alive connection per request first, as behind a proxy's upstream
            # pool: what is then timed is the service's answer, not TCP connection setup.
            await asyncio.gather(*(_probe(client) for _ in range(count)))
        return list(await asyncio.gather(*(one(i) for i in range(count))))


async def _probe(client: aiohttp.ClientSession) -> None:
    async with client.get("/live") as response:
        await response.read()


def _burst_process(url: str, count: int, seed: int, warm: bool) -> Outcomes:
    return asyncio.run(_burst(url, count, seed, warm))


def _poll_health(url: str, period_s: float, stop: object, results: object) -> None:
    parts = urlsplit(url)
    latencies: list[tuple[int, float]] = []
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    while not stop.is_set():  # type: ignore[attr-defined]
        started = time.perf_counter()
        try:
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            latencies.append((response.status, time.perf_counter() - started))
        except (OSError, http.client.HTTPException):
            latencies.append((0, time.perf_counter() - started))
            connection.close()
            connection = http.client.HTTPConnection(
                parts.hostname or "127.0.0.1", parts.port, timeout=10
            )
        time.sleep(max(0.0, period_s - (time.perf_counter() - started)))
    results.put(latencies)  # type: ignore[attr-defined]


def flood(
    url: str, requests: int, processes: int, seed: int = 1, warm: bool = False
) -> FloodReport:
    """``warm``: each client opens its connections before the flood (see ``_burst``)."""
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    poller = context.Process(target=_poll_health, args=(url, 0.05, stop, results))
    poller.start()
    time.sleep(0.5)  # a few polls before the flood
    share = [
        requests // processes + (1 if i < requests % processes else 0) for i in range(processes)
    ]
    started = time.perf_counter()
    with context.Pool(processes) as pool:
        parts = pool.starmap(
            _burst_process, [(url, n, seed + i, warm) for i, n in enumerate(share)]
        )
    duration = time.perf_counter() - started
    stop.set()
    health: list[tuple[int, float]] = results.get(timeout=30)
    poller.join(timeout=10)
    outcomes = [outcome for part in parts for outcome in part]
    statuses = Counter(str(status) for status, _ in outcomes)
    refusals = [1000 * latency for status, latency in outcomes if status == 429]
    ok = [latency for status, latency in outcomes if status == 200]
    health_ms = [1000 * latency for _, latency in health]
    return FloodReport(
        warm_connections=warm,
        requests=requests,
        answered=sum(1 for status, _ in outcomes if status),
        lost=statuses.get("0", 0),
        by_status=dict(statuses),
        duration_s=round(duration, 3),
        refusal_p50_ms=round(percentile(refusals, 0.5), 2),
        refusal_p99_ms=round(percentile(refusals, 0.99), 2),
        ok_p50_s=round(percentile(ok, 0.5), 3),
        health_polls=len(health),
        health_p50_ms=round(percentile(health_ms, 0.5), 2),
        health_p99_ms=round(percentile(health_ms, 0.99), 2),
        health_max_ms=round(max(health_ms, default=0.0), 2),
        health_not_200=dict(Counter(str(s) for s, _ in health if s != 200)),
    )


async def _goodput(url: str, rate: float, duration_s: float, deadline_s: float) -> GoodputReport:
    count = int(rate * duration_s)
    jobs = make_jobs(count, seed=7)
    headers = {"X-Request-Timeout": str(deadline_s)}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=aiohttp.ClientTimeout(total=600), trust_env=False
    ) as client:

        async def one(index: int) -> tuple[int, int]:
            job = jobs[index]
            try:
                async with client.post(
                    "/translate",
                    json={"text": job.texts[0], "target_lang": job.target_lang},
                    headers=headers,
                ) as response:
                    body = await response.json() if response.status == 200 else None
                    tokens = body["usage"]["output_tokens"] if body else 0
                    return response.status, tokens
            except (aiohttp.ClientError, TimeoutError):
                return 0, 0

        started = time.perf_counter()
        tasks = []
        for index in range(count):
            tasks.append(asyncio.create_task(one(index)))
            await asyncio.sleep(max(0.0, started + (index + 1) / rate - time.perf_counter()))
        outcomes = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    statuses = Counter(str(status) for status, _ in outcomes)
    admitted = count - statuses.get("429", 0)
    finished = statuses.get("200", 0)
    return GoodputReport(
        rate=rate,
        duration_s=duration_s,
        deadline_s=deadline_s,
        requests=count,
        by_status=dict(statuses),
        admitted=admitted,
        finished_in_deadline=finished,
        goodput_share_of_admitted=round(finished / admitted, 4) if admitted else 0.0,
        output_tokens_per_s=round(sum(tokens for _, tokens in outcomes) / elapsed, 1),
    )


def goodput(url: str, rate: float, duration_s: float, deadline_s: float) -> GoodputReport:
    return asyncio.run(_goodput(url, rate, duration_s, deadline_s))


def main(argv: list[str] | None = None) -> object:
    parser = argparse.ArgumentParser(prog="python -m loadtests.overload", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--report", type=Path)
    modes = parser.add_subparsers(dest="mode", required=True)
    f = modes.add_parser("flood")
    f.add_argument("--requests", type=int, default=4096)
    f.add_argument("--processes", type=int, default=4)
    f.add_argument("--warm", action="store_true", help="open the connections first")
    g = modes.add_parser("goodput")
    g.add_argument("--rate", type=float, required=True)
    g.add_argument("--duration", type=float, default=20.0)
    g.add_argument("--deadline", type=float, default=10.0)
    args = parser.parse_args(argv)
    report: object
    if args.mode == "flood":
        report = flood(args.url, args.requests, args.processes, warm=args.warm)
    else:
        report = goodput(args.url, args.rate, args.duration, args.deadline)
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
