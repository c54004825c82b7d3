"""Overload behaviour of a running service: how fast refusals come, whether probes stay fast,
and how much of what is admitted finishes inside its deadline.

- ``flood``: ``--requests`` requests sent at once, one connection each, by ``--processes``
  client processes of raw sockets with the requests encoded beforehand, all released by one
  barrier (so what is timed is the service, not a client's own event loop), while a separate
  process polls ``/health`` every 50 ms; ``--warm`` opens every connection before the flood, as
  a proxy's upstream keep-alive pool would have them open, so TCP setup is not what is timed.
  Reports the count per status, requests lost (no answer), time to 429 p50/p99 (send to answer,
  client side) and ``/health`` latency p50/p99/max during the flood.
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
import json
import multiprocessing
import selectors
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from loadtests.loadgen import allow_open_files, emit, percentile, source_address
from loadtests.texts import Job, make_jobs


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
    sources: int = 0


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
# While sending a burst, answers already in are read after every this many requests.
_READ_EVERY = 16


def _request_bytes(host: str, job: Job) -> bytes:
    body = json.dumps({"text": job.texts[0], "target_lang": job.target_lang}).encode()
    head = (
        f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Exchange:
    """One request on its own connection: sent, then read until its whole answer is in."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.socket: socket.socket | None = None
        self.started = 0.0
        self.answered = 0.0
        self.status = 0
        self.buffer = b""
        self.expected: int | None = None  # bytes of the whole answer, once its head is in

    def connect(self, address: tuple[str, int], source: str | None = None) -> None:
        bound = None if source is None else (source, 0)
        self.socket = socket.create_connection(address, timeout=30, source_address=bound)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socket.setblocking(False)

    def send(self) -> None:
        assert self.socket is not None
        self.started = time.perf_counter()
        sent = self.socket.send(self.request)  # a few hundred bytes: all fit the empty buffer
        if sent < len(self.request):
            self.socket.setblocking(True)
            self.socket.sendall(self.request[sent:])
            self.socket.setblocking(False)

    def receive(self) -> bool:
        """Read what has arrived; True once the answer is complete (or the peer closed)."""
        assert self.socket is not None
        try:
            chunk = self.socket.recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            return True  # closed: lost, unless a whole answer was already in
        if not self.buffer:
            self.answered = time.perf_counter()
        self.buffer += chunk
        if self.expected is None and b"\r\n\r\n" in self.buffer:
            head, _, _ = self.buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            length = next(
                (int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                 if k.strip().lower() == "content-length"),
                0,
            )  # fmt: skip
            self.expected = len(head) + 4 + length
        return self.expected is not None and len(self.buffer) >= self.expected


def _burst(
    url: str,
    count: int,
    seed: int,
    warm: bool,
    start: object,
    sources: int = 0,
    first: int = 0,
    timeout_s: float = 600,
) -> Outcomes:
    """``count`` requests on ``count`` connections, sent back to back once every client is at
    the ``start`` barrier; with ``sources``, request ``first + n`` of the flood from loopback
    address ``(first + n) % sources`` (``loadgen.source_address``).

    Raw sockets and requests encoded beforehand: an aiohttp client's own event loop took tens of
    milliseconds to issue a few hundred requests, and that was timed as the service's refusal.
    """
    allow_open_files(count + 256)
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    host = f"{address[0]}:{address[1]}"
    exchanges = [_Exchange(_request_bytes(host, job)) for job in make_jobs(count, seed=seed)]
    origins = [source_address((first + n) % sources) if sources else None for n in range(count)]
    selector = selectors.DefaultSelector()
    if warm:  # connected and registered before the barrier: only the sends are in the window
        for exchange, origin in zip(exchanges, origins, strict=True):
            exchange.connect(address, origin)
            selector.register(exchange.socket, selectors.EVENT_READ, exchange)  # type: ignore[arg-type]
    start.wait()  # type: ignore[attr-defined]
    pending = len(exchanges)

    def read(timeout: float) -> None:
        nonlocal pending
        for key, _ in selector.select(timeout=timeout):
            exchange = key.data
            if exchange.receive():
                selector.unregister(key.fileobj)
                pending -= 1

    for index, exchange in enumerate(exchanges):
        if not warm:
            began = time.perf_counter()
            exchange.connect(address, origins[index])
            exchange.send()
            exchange.started = began  # cold: the connection's setup is part of the wait
            selector.register(exchange.socket, selectors.EVENT_READ, exchange)  # type: ignore[arg-type]
        else:
            exchange.send()
        if index % _READ_EVERY == _READ_EVERY - 1:
            # Answers that arrived while sending are read now, not once every request is out:
            # otherwise the client's own sending would be timed as the service's answer.
            read(0)
    deadline = time.perf_counter() + timeout_s
    while pending and time.perf_counter() < deadline:
        read(1.0)
    outcomes: Outcomes = []
    for exchange in exchanges:
        assert exchange.socket is not None
        exchange.socket.close()
        complete = exchange.expected is not None and len(exchange.buffer) >= exchange.expected
        status = exchange.status if complete else 0
        outcomes.append((status, (exchange.answered or time.perf_counter()) - exchange.started))
    return outcomes


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
    url: str, requests: int, processes: int, seed: int = 1, warm: bool = False, sources: int = 0
) -> FloodReport:
    """``warm``: each client opens its connections before the flood (see ``_burst``);
    ``sources``: the requests come from that many loopback addresses in turn (through nginx,
    that many clients of its per-address rate limit)."""
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    poller = context.Process(target=_poll_health, args=(url, 0.05, stop, results))
    poller.start()
    time.sleep(0.5)  # a few polls before the flood
    share = [
        requests // processes + (1 if i < requests % processes else 0) for i in range(processes)
    ]
    with context.Manager() as manager:
        # Every client has its requests encoded (and, warm, its connections open) before any
        # of them sends: the flood is one burst, not one client after another.
        start = manager.Barrier(processes + 1)
        with context.Pool(processes) as pool:
            firsts = [sum(share[:i]) for i in range(processes)]
            pending = pool.starmap_async(
                _burst,
                [(url, n, seed + i, warm, start, sources, firsts[i]) for i, n in enumerate(share)],
            )
            start.wait(timeout=300)
            started = time.perf_counter()
            parts = pending.get(timeout=900)
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
        sources=sources,
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
    f.add_argument("--sources", type=int, default=0, help="loopback source addresses (0: one)")
    g = modes.add_parser("goodput")
    g.add_argument("--rate", type=float, required=True)
    g.add_argument("--duration", type=float, default=20.0)
    g.add_argument("--deadline", type=float, default=10.0)
    args = parser.parse_args(argv)
    report: object
    if args.mode == "flood":
        report = flood(
            args.url, args.requests, args.processes, warm=args.warm, sources=args.sources
        )
    else:
        report = goodput(args.url, args.rate, args.duration, args.deadline)
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
