"""What the process split costs: requests through the real ``EngineClient`` and engine process
to an engine that answers at once, so what is timed is IPC, encoding and the two event loops.

- ``lone``: one request at a time, round trip (submit to answer) p50/p99.
- ``burst``: ``--requests`` submitted together; wall time per request.

    python -m loadtests.ipc --requests 4096 --report ipc.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.loadgen import emit, percentile
from service.engine.client import EngineClient
from service.engine.config import BatchingConfig, EngineConfig
from service.engine.protocol import TokenizerSpec
from service.engine.types import Decoding, EngineInfo, GenerationRequest, GenerationResult

DECODING = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


class EchoEngine:
    """A static engine whose batches cost nothing: every answer is ready at once."""

    info = EngineInfo("echo", None, "float32", "none", "cpu", 0.0, 0)
    tokenizer = TokenizerSpec(tokenizer_json="{}", before=[], after=[])

    def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult("ok", len(r.prompt_ids), 1, "stop") for r in batch]

    def memory_bytes(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        return None


def load_echo(config: EngineConfig) -> EchoEngine:
    return EchoEngine()


@dataclass
class IpcReport:
    lone_requests: int
    lone_round_trip_p50_us: float
    lone_round_trip_p99_us: float
    burst_requests: int
    burst_wall_s: float
    burst_us_per_request: float


async def measure(lone: int, burst: int) -> IpcReport:
    # Batches flush at once and are large: the engine side adds no waiting of its own.
    config = EngineConfig(batching=BatchingConfig(max_batch_size=4096, max_wait_s=0.0))
    client = EngineClient(config, load_echo)
    await client.start()
    request = GenerationRequest(tuple(range(60)), 64, DECODING)
    try:
        for _ in range(50):  # warm both loops
            await client.submit(request, None)[1]
        trips = []
        for _ in range(lone):
            started = time.perf_counter()
            await client.submit(request, None)[1]
            trips.append(1e6 * (time.perf_counter() - started))
        started = time.perf_counter()
        await asyncio.gather(*(client.submit(request, None)[1] for _ in range(burst)))
        wall = time.perf_counter() - started
    finally:
        await client.stop()
    return IpcReport(
        lone_requests=lone,
        lone_round_trip_p50_us=round(percentile(trips, 0.5), 1),
        lone_round_trip_p99_us=round(percentile(trips, 0.99), 1),
        burst_requests=burst,
        burst_wall_s=round(wall, 4),
        burst_us_per_request=round(1e6 * wall / burst, 1),
    )


def main(argv: list[str] | None = None) -> IpcReport:
    parser = argparse.ArgumentParser(prog="python -m loadtests.ipc", description=__doc__)
    parser.add_argument("--lone", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.lone, args.requests))
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
