"""The scheduler in front of a continuous engine: results, cancellation, errors, drain."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.contract.errors import EngineUnavailable, GenerationFailed
from service.contract.tokenizer import TokenizerSpec
from service.contract.types import (
    Completion,
    Decoding,
    EngineInfo,
    GenerationRequest,
    GenerationResult,
    TextSink,
)
from service.engine.requests import PendingRequests
from tests.fakes import char_tokenizer

DECODING = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


class ManualEngine:
    """Holds submitted requests until the test completes them."""

    def __init__(self) -> None:
        self.submitted: dict[str, Completion] = {}
        self.deadlines: dict[str, float | None] = {}
        self.cancelled: list[str] = []
        self.info = EngineInfo("manual", None, "float32", "none", "cpu", 0.0, 0)

    def memory_bytes(self) -> dict[str, int]:
        return {}

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
        deadline: float | None = None,
    ) -> None:
        self.submitted[request_id] = on_done
        self.deadlines[request_id] = deadline

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def is_alive(self) -> bool:
        return True

    @property
    def tokenizer(self) -> TokenizerSpec:
        return char_tokenizer()

    def capacity(self) -> int | None:
        return 8

    def running(self) -> int | None:
        return None

    def device_seconds(self) -> float | None:
        return None

    def loop_seconds(self) -> dict[str, float]:
        return {}

    def steps(self) -> int | None:
        return None

    def step_seconds(self) -> dict[int, float]:
        return {}

    def close(self) -> None:
        return None

    def finish(self, request_id: str, text: str = "ok") -> None:
        self.submitted.pop(request_id)(GenerationResult(text, 3, 2, "stop"), 0.01, 0.02)


def request() -> GenerationRequest:
    return GenerationRequest((1, 2, 3), 4, DECODING)


async def test_results_reach_their_callers_with_timings() -> None:
    engine = ManualEngine()
    scheduler = PendingRequests(engine)
    task = asyncio.ensure_future(scheduler.submit(request()))
    await asyncio.sleep(0)
    assert scheduler.running == 1
    engine.finish(next(iter(engine.submitted)), "hello")
    scheduled = await task
    assert scheduled.result.text == "hello"
    assert (scheduled.queue_s, scheduled.inference_s) == (0.01, 0.02)
    assert scheduler.running == 0


async def test_the_engine_gets_the_requests_deadline_to_drop_it_while_it_waits() -> None:
    # The engine's scheduler, not only this layer's timer, must know the deadline: a request
    # that reaches its turn after the deadline (its caller answered 504, the cancel still on
    # its way) must not reach the model.
    engine = ManualEngine()
    scheduler = PendingRequests(engine)
    deadline = time.monotonic() + 30
    task = asyncio.ensure_future(scheduler.submit(request(), deadline))
    await asyncio.sleep(0)
    assert list(engine.deadlines.values()) == [deadline]
    engine.finish(next(iter(engine.submitted)))
    await task


async def test_a_caller_leaving_cancels_its_request_in_the_engine() -> None:
    engine = ManualEngine()
    scheduler = PendingRequests(engine)
    task = asyncio.ensure_future(scheduler.submit(request()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.cancelled == list(engine.submitted)
    assert scheduler.running == 0


async def test_engine_errors_reach_the_caller() -> None:
    engine = ManualEngine()
    scheduler = PendingRequests(engine)
    task = asyncio.ensure_future(scheduler.submit(request()))
    await asyncio.sleep(0)
    engine.submitted.popitem()[1](GenerationFailed("the model failed"), 0.0, 0.0)
    with pytest.raises(GenerationFailed):
        await task


async def test_close_drains_then_fails_what_is_left() -> None:
    engine = ManualEngine()
    scheduler = PendingRequests(engine)
    finished = asyncio.ensure_future(scheduler.submit(request()))
    stuck = asyncio.ensure_future(scheduler.submit(request()))
    await asyncio.sleep(0)
    first = next(iter(engine.submitted))
    asyncio.get_running_loop().call_later(0.02, engine.finish, first)
    await scheduler.close(drain_timeout_s=0.2)
    assert (await finished).result.text == "ok"
    with pytest.raises(EngineUnavailable):
        await stuck
    with pytest.raises(EngineUnavailable):
        await scheduler.submit(request())
