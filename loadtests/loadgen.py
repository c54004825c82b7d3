"""HTTP load generator for the translation service.

Closed loop (``--concurrency N`` clients, each sending its next request when the last answered) or
open loop (``--rate R`` Poisson arrivals per second, whatever the answers), a warm-up that is not
measured, a bounded number of requests and a time bound, single (``/translate``) or batch
(``/batch_translate``) requests, a progress line, and a JSON report: requests/s, output tokens/s
(from the service's own ``usage``), latency p50/p90/p99 and errors by status. A closed loop
also reports its steady state (``steady_state``): the output tokens/s between the clients' first
full turnover and the moment the last request was sent, leaving out the engine filling up and
the drain at the end, which the whole run's figure includes.

In the closed loop the connections are opened before the clock starts (``GET /live`` on each),
as nginx's upstream keep-alive pool holds them open in production; otherwise the first second
of a 1,024-client run measures TCP setup, not the service. ``--cold-connections`` keeps that in.

    python -m loadtests.loadgen --url http://127.0.0.1:8000 --requests 1024 --concurrency 256

``--sources N`` sends from N loopback addresses (127.0.0.2 onwards), the clients spread over
them: through the shipped nginx, whose rate limit is per client address, that is N users, not one
that nginx holds to 20 requests/s.

The client is aiohttp, not httpx: with 1,024 requests in flight httpx's connection pool itself
became the bottleneck. Against a server that answers every request after 2 s, on this project's
2-core machine, the last of 1,024 concurrent httpx requests came back after 8.06-8.07 s, the last
aiohttp one after 2.32-2.33 s; a load generator must not be what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from loadtests.texts import Job, make_jobs


@dataclass
class Outcome:
    status: int
    latency_s: float
    texts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    # When the answer came, in seconds since the run's start (set by the loops).
    finished_s: float = 0.0


@dataclass
class Report:
    mode: str
    route: str
    requests: int
    ok: int
    duration_s: float
    requests_per_s: float
    texts_per_s: float
    output_tokens: int
    input_tokens: int
    output_tokens_per_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    ms_per_output_token_p50: float
    errors_by_status: dict[str, int] = field(default_factory=dict)
    concurrency: int | None = None
    rate: float | None = None
    # A closed loop's steady state (``steady_state``): output tokens/s between the first full
    # turnover of the clients and the moment the last request was sent, and that window.
    steady_output_tokens_per_s: float | None = None
    steady_window_s: float | None = None
    # How long the refused (429) requests waited for their answer: refused at once, or late.
    refused_p99_s: float | None = None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def send(client: aiohttp.ClientSession, job: Job, route: str) -> Outcome:
    started = time.perf_counter()
    if route == "batch":
        payload: dict[str, object] = {"texts": list(job.texts), "target_lang": job.target_lang}
        path = "/batch_translate"
    else:
        payload = {"text": job.texts[0], "target_lang": job.target_lang}
        path = "/translate"
    try:
        async with client.post(path, json=payload) as response:
            status = response.status
            body = await response.json() if status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return Outcome(status=0, latency_s=time.perf_counter() - started)
    outcome = Outcome(status=status, latency_s=time.perf_counter() - started)
    if body is not None:
        usage = body["usage"]
        outcome.texts = len(body.get("translations", [body]))
        outcome.input_tokens = usage["input_tokens"]
        outcome.output_tokens = usage["output_tokens"]
    return outcome


async def open_connections(client: aiohttp.ClientSession, count: int) -> None:
    """Open ``count`` keep-alive connections to the service (left in the client's pool)."""

    async def one() -> None:
        async with client.get("/live") as response:
            await response.read()

    await asyncio.gather(*(one() for _ in range(count)))


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.tokens = total, enabled, 0, 0
        self.started = time.perf_counter()

    def update(self, outcome: Outcome) -> None:
        self.done += 1
        self.tokens += outcome.output_tokens
        if self.enabled and (self.done % 16 == 0 or self.done == self.total):
            elapsed = time.perf_counter() - self.started
            sys.stderr.write(
                f"\r{self.done}/{self.total} requests  {self.tokens / elapsed:8.1f} output tok/s"
                f"  {elapsed:6.1f} s"
            )
            if self.done == self.total:
                sys.stderr.write("\n")


def allow_open_files(count: int) -> None:
    """Raise this process's soft limit on open files to hold ``count`` (up to the hard limit):
    a default soft limit of 1,024 cannot hold 2,048 client connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def source_address(index: int) -> str:
    """The ``index``-th client address of ``--sources``: 127.0.0.2 onwards (Linux answers for all
    of 127.0.0.0/8 on the loopback interface)."""
    if not 0 <= index < 250 * 256:
        raise ValueError("at most 64,000 source addresses")
    return f"127.0.{index // 250}.{index % 250 + 2}"


async def closed_loop(
    clients: list[aiohttp.ClientSession], jobs: list[Job], route: str, concurrency: int,
    deadline: float, progress: Progress,
) -> tuple[list[Outcome], float]:  # fmt: skip
    """Every outcome, and when the last request was sent (seconds since the start): until
    then ``concurrency`` requests were in flight all the time."""
    queue = list(reversed(jobs))
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    drained = [0.0]

    async def worker(client: aiohttp.ClientSession) -> None:
        while queue and time.perf_counter() < deadline:
            job = queue.pop()
            if not queue:
                drained[0] = time.perf_counter() - started
            outcome = await send(client, job, route)
            outcome.finished_s = time.perf_counter() - started
            outcomes.append(outcome)
            progress.update(outcome)

    await asyncio.gather(*(worker(clients[n % len(clients)]) for n in range(concurrency)))
    return outcomes, drained[0] or time.perf_counter() - started


def steady_state(
    outcomes: list[Outcome], concurrency: int, drained_s: float
) -> tuple[float, float] | None:
    """A closed loop's output tokens/s in its steady state, and the window's length: from the
    answer that completes the clients' first turnover (``concurrency`` answers: the engine has
    filled up) to the moment the last request was sent (after it the clients run out of work
    and the load drains). None where no such window exists (too few requests)."""
    answered = sorted((o for o in outcomes if o.status == 200), key=lambda o: o.finished_s)
    if len(answered) <= concurrency:
        return None
    begin = answered[concurrency - 1].finished_s
    window = drained_s - begin
    if window <= 0:
        return None
    tokens = sum(o.output_tokens for o in answered if begin < o.finished_s <= drained_s)
    return tokens / window, window


async def open_loop(
    clients: list[aiohttp.ClientSession], jobs: list[Job], route: str, rate: float,
    deadline: float, progress: Progress, seed: int,
) -> list[Outcome]:  # fmt: skip
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Outcome]] = []
    for n, job in enumerate(jobs):
        if time.perf_counter() >= deadline:
            break
        task = asyncio.create_task(send(clients[n % len(clients)], job, route))
        task.add_done_callback(lambda t: progress.update(t.result()))
        tasks.append(task)
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.gather(*tasks))


async def run(args: argparse.Namespace) -> Report:
    batch = args.batch_size if args.route == "batch" else 1
    jobs = make_jobs(args.requests + args.warmup, batch_size=batch, seed=args.seed)
    warm, measured = jobs[: args.warmup], jobs[args.warmup :]
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    sources = max(1, args.sources)
    limit = max(args.concurrency // sources + 1, 64) * 2
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    args.url,
                    connector=aiohttp.TCPConnector(
                        limit=limit,
                        local_addr=(source_address(n), 0) if args.sources else None,
                    ),
                    timeout=timeout,
                    trust_env=False,
                )
            )
            for n in range(sources)
        ]
        for job in warm:
            await send(clients[0], job, args.route)
        if args.mode == "closed" and not args.cold_connections:
            await asyncio.gather(
                *(
                    open_connections(client, len(range(n, args.concurrency, sources)))
                    for n, client in enumerate(clients)
                )
            )
        progress = Progress(len(measured), not args.quiet)
        started = time.perf_counter()
        deadline = started + args.duration
        steady = None
        if args.mode == "open":
            outcomes = await open_loop(
                clients, measured, args.route, args.rate, deadline, progress, args.seed
            )
        else:
            outcomes, drained = await closed_loop(
                clients, measured, args.route, args.concurrency, deadline, progress
            )
            steady = steady_state(outcomes, args.concurrency, drained)
        duration = time.perf_counter() - started
    ok = [o for o in outcomes if o.status == 200]
    latencies = [o.latency_s for o in ok]
    per_token = [1000 * o.latency_s / o.output_tokens for o in ok if o.output_tokens]
    refused = [o.latency_s for o in outcomes if o.status == 429]
    output_tokens = sum(o.output_tokens for o in ok)
    return Report(
        mode=args.mode,
        route=args.route,
        requests=len(outcomes),
        ok=len(ok),
        duration_s=round(duration, 3),
        requests_per_s=round(len(ok) / duration, 3),
        texts_per_s=round(sum(o.texts for o in ok) / duration, 3),
        output_tokens=output_tokens,
        input_tokens=sum(o.input_tokens for o in ok),
        output_tokens_per_s=round(output_tokens / duration, 1),
        latency_p50_s=round(percentile(latencies, 0.5), 4),
        latency_p90_s=round(percentile(latencies, 0.9), 4),
        latency_p99_s=round(percentile(latencies, 0.99), 4),
        ms_per_output_token_p50=round(percentile(per_token, 0.5), 2),
        errors_by_status=dict(Counter(str(o.status) for o in outcomes if o.status != 200)),
        concurrency=args.concurrency if args.mode == "closed" else None,
        rate=args.rate if args.mode == "open" else None,
        steady_output_tokens_per_s=None if steady is None else round(steady[0], 1),
        steady_window_s=None if steady is None else round(steady[1], 3),
        refused_p99_s=round(percentile(refused, 0.99), 4) if refused else None,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.loadgen", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--mode", choices=("closed", "open"), default="closed")
    p.add_argument("--concurrency", type=int, default=32, help="closed loop: clients")
    p.add_argument("--rate", type=float, default=10.0, help="open loop: requests per second")
    p.add_argument("--requests", type=int, default=256, help="measured requests (bound)")
    p.add_argument("--duration", type=float, default=600.0, help="time bound, seconds")
    p.add_argument("--warmup", type=int, default=4, help="unmeasured requests first")
    p.add_argument("--route", choices=("single", "batch"), default="single")
    p.add_argument("--batch-size", type=int, default=8, help="texts per batch request")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--sources",
        type=int,
        default=0,
        help="send from this many loopback addresses, 127.0.0.2 onwards (0: the default one)",
    )
    p.add_argument(
        "--cold-connections",
        action="store_true",
        help="closed loop: open connections inside the measured time",
    )
    return p


def emit(report: object, path: Path | None) -> None:
    """Print a report dataclass as JSON, and write it to ``path`` when one is given."""
    text = json.dumps(asdict(report), indent=2)  # type: ignore[call-overload]
    if path is not None:
        path.write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> Report:
    args = parser().parse_args(argv)
    allow_open_files(2 * max(args.concurrency, 64) + 256)
    report = asyncio.run(run(args))
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
