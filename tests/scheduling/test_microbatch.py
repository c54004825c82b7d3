"""The micro-batch scheduler's public behaviour (as the engine process runs it), with an
in-process engine on a real worker thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from service.engine.config import BatchingConfig
from service.engine.protocol import TokenizerSpec
from service.engine.types import Decoding, EngineInfo, GenerationRequest, GenerationResult
from service.engine.worker import EngineWorker
from service.errors import EngineUnavailable, GenerationFailed
from service.scheduling.microbatch import MicroBatchScheduler
from tests.fakes import char_tokenizer


class FakeEngine:
    """Echoes each prompt's length and records its batches; ``gate`` holds each batch."""

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        fail: Callable[[Sequence[GenerationRequest]], Exception | None] | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.delay_s, self.fail, self.gate = delay_s, fail, gate
        self.batches: list[list[GenerationRequest]] = []

    def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(list(batch))
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None and (error := self.fail(batch)) is not None:
            raise error
        return [
            GenerationResult(f"out:{len(r.prompt_ids)}", len(r.prompt_ids), 3, "stop")
            for r in batch
        ]

    def close(self) -> None:
        return None

    @property
    def info(self) -> EngineInfo:
        return EngineInfo("fake", None, "float32", "none", "cpu", 0.0, 0)

    @property
    def tokenizer(self) -> TokenizerSpec:
        return char_tokenizer()

    def memory_bytes(self) -> dict[str, int]:
        return {}

    @property
    def items_seen(self) -> int:
        return sum(len(batch) for batch in self.batches)


DECODING = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


def request(length: int, decoding: Decoding = DECODING) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(range(length)), max_new_tokens=4, decoding=decoding)


MakeScheduler = Callable[..., tuple[MicroBatchScheduler, FakeEngine]]


@pytest.fixture
async def make_scheduler() -> AsyncIterator[MakeScheduler]:
    created: list[tuple[MicroBatchScheduler, EngineWorker]] = []

    def make(
        engine: FakeEngine | None = None, **limits: float
    ) -> tuple[MicroBatchScheduler, FakeEngine]:
        engine = engine or FakeEngine()
        values = {"max_batch_size": 4, "max_batch_tokens": 10_000, "max_wait_s": 0.05}
        values.update(limits)
        worker = EngineWorker(lambda: engine)
        scheduler = MicroBatchScheduler(worker, BatchingConfig(**values))  # type: ignore[arg-type]
        created.append((scheduler, worker))
        return scheduler, engine

    yield make
    for scheduler, worker in created:
        await scheduler.close(drain_timeout_s=1)
        await worker.close()


async def started(make: MakeScheduler, **kwargs: object) -> tuple[MicroBatchScheduler, FakeEngine]:
    scheduler, engine = make(**kwargs)
    await scheduler._runner.start()  # type: ignore[attr-defined]
    scheduler.start()
    return scheduler, engine


async def test_flushes_when_the_batch_is_full(make_scheduler: MakeScheduler) -> None:
    scheduler, engine = await started(make_scheduler, max_batch_size=4, max_wait_s=30)
    await asyncio.wait_for(
        asyncio.gather(*(scheduler.submit(request(n)) for n in (3, 4, 5, 6))), timeout=5
    )
    assert [len(batch) for batch in engine.batches] == [4]


async def test_flushes_after_max_wait_when_not_full(make_scheduler: MakeScheduler) -> None:
    scheduler, engine = await started(make_scheduler, max_batch_size=8, max_wait_s=0.05)
    loop = asyncio.get_running_loop()
    began = loop.time()
    results = await asyncio.gather(scheduler.submit(request(3)), scheduler.submit(request(4)))
    assert loop.time() - began >= 0.04
    assert [len(batch) for batch in engine.batches] == [2]
    assert results[0].queue_s >= 0.04


async def test_each_caller_gets_its_own_result(make_scheduler: MakeScheduler) -> None:
    scheduler, _ = await started(make_scheduler, max_batch_size=3)
    lengths = [7, 2, 9, 4, 4, 12, 1]
    results = await asyncio.gather(*(scheduler.submit(request(n)) for n in lengths))
    assert [r.result.text for r in results] == [f"out:{n}" for n in lengths]


async def test_batches_group_similar_lengths(make_scheduler: MakeScheduler) -> None:
    gate = threading.Event()
    scheduler, engine = await started(
        make_scheduler, engine=FakeEngine(gate=gate), max_batch_size=2, max_wait_s=0
    )
    blocker = asyncio.ensure_future(scheduler.submit(request(1)))
    await asyncio.sleep(0.05)  # the worker now holds the blocker; the rest queue up
    rest = [asyncio.ensure_future(scheduler.submit(request(n))) for n in (10, 50, 11, 52)]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(blocker, *rest)
    shapes = [sorted(len(r.prompt_ids) for r in batch) for batch in engine.batches]
    assert shapes == [[1], [10, 11], [50, 52]]


async def test_batch_token_bound_splits_batches(make_scheduler: MakeScheduler) -> None:
    scheduler, engine = await started(
        make_scheduler, max_batch_size=8, max_batch_tokens=20, max_wait_s=0.02
    )
    await asyncio.gather(*(scheduler.submit(request(10)) for _ in range(4)))
    assert all(len(batch) * 10 <= 20 for batch in engine.batches)
    assert sum(len(batch) for batch in engine.batches) == 4


async def test_different_decodings_never_share_a_batch(make_scheduler: MakeScheduler) -> None:
    other = Decoding(greedy=False, temperature=0.7, top_k=20, top_p=0.6, repetition_penalty=1.05)
    scheduler, engine = await started(make_scheduler, max_batch_size=8, max_wait_s=0.02)
    await asyncio.gather(
        scheduler.submit(request(3)),
        scheduler.submit(request(3, other)),
        scheduler.submit(request(4)),
    )
    for batch in engine.batches:
        assert len({r.decoding for r in batch}) == 1


async def test_a_failed_batch_fails_each_item_and_the_loop_goes_on(
    make_scheduler: MakeScheduler,
) -> None:
    calls = {"n": 0}

    def fail_first(batch: Sequence[GenerationRequest]) -> Exception | None:
        calls["n"] += 1
        return RuntimeError("boom") if calls["n"] == 1 else None

    scheduler, _ = await started(
        make_scheduler, engine=FakeEngine(fail=fail_first), max_batch_size=3, max_wait_s=0.02
    )
    outcomes = await asyncio.gather(
        *(scheduler.submit(request(n)) for n in (1, 2, 3)), return_exceptions=True
    )
    assert all(isinstance(o, GenerationFailed) for o in outcomes)
    assert "boom" not in str(outcomes[0])  # no internals to clients
    after = await scheduler.submit(request(5))
    assert after.result.text == "out:5"


async def test_cancelled_callers_never_reach_the_engine(make_scheduler: MakeScheduler) -> None:
    gate = threading.Event()
    scheduler, engine = await started(
        make_scheduler, engine=FakeEngine(gate=gate), max_batch_size=8, max_wait_s=0
    )
    running = asyncio.ensure_future(scheduler.submit(request(1)))
    await asyncio.sleep(0.05)
    abandoned = [asyncio.ensure_future(scheduler.submit(request(2))) for _ in range(3)]
    kept = asyncio.ensure_future(scheduler.submit(request(3)))
    await asyncio.sleep(0)
    for task in abandoned:
        task.cancel()
    gate.set()
    await asyncio.gather(running, kept)
    assert engine.items_seen == 2


async def test_close_drains_queued_work_then_refuses(make_scheduler: MakeScheduler) -> None:
    scheduler, _ = await started(make_scheduler, engine=FakeEngine(delay_s=0.02), max_batch_size=2)
    pending = [asyncio.ensure_future(scheduler.submit(request(n))) for n in range(1, 6)]
    await asyncio.sleep(0)
    await scheduler.close(drain_timeout_s=5)
    results = await asyncio.gather(*pending)
    assert [r.result.text for r in results] == [f"out:{n}" for n in range(1, 6)]
    with pytest.raises(EngineUnavailable):
        await scheduler.submit(request(1))
