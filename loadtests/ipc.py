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
from dataclasses import dataclass
from pathlib import Path

from loadtests.loadgen import emit, percentile
from service.config.engine import EngineConfig
from service.contract.tokenizer import TokenizerSpec
from service.contract.types import (
    Completion,
    Decoding,
    EngineInfo,
    GenerationRequest,
    GenerationResult,
    TextSink,
)
from service.frontend.engine_link.client import EngineClient
from service.wiring import engine_entry

DECODING = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


class EchoEngine:
    """An engine whose steps cost nothing: every answer is ready at once."""

    kind = "echo"
    info = EngineInfo("echo", None, "float32", "none", "cpu", 0.0, 0)
    tokenizer = TokenizerSpec(tokenizer_json="{}", before=[], after=[])

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
        deadline: float | None = None,
    ) -> None:
        result = GenerationResult("ok", len(request.prompt_ids), 1, "stop")
        asyncio.get_running_loop().call_soon(on_done, result, 0.0, 0.0)

    def cancel(self, request_id: str) -> None:
        return None

    def capacity(self) -> int | None:
        return 4096

    def running(self) -> int | None:
        return 0

    def steps(self) -> int | None:
        return 0

    def step_seconds(self) -> dict[int, float]:
        return {}

    def device_seconds(self) -> float | None:
        return None

    def loop_seconds(self) -> dict[str, float]:
        return {}

    def is_alive(self) -> bool:
        return True

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
    config = EngineConfig()
    client = EngineClient(config, engine_entry(load_echo))
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
