"""The asyncio micro-batching queue in front of the engine worker.

Each submitted request gets one future. A single loop task forms batches: it waits until
``max_batch_size`` texts are queued or the oldest has waited ``max_wait_ms``, then takes the oldest
text plus the queued texts nearest to it in prompt length (less padding), within the batch's row and
token bounds, and hands them to the worker. While the worker runs a batch the queue fills, so
under load batches form without waiting. Items whose caller has gone (their future was cancelled)
are dropped before they reach the model. A failed batch fails each of its items with a typed
error and the loop goes on; a batch that runs out of memory is retried in halves down to single
texts. The queue is bounded: beyond ``max_queue_size`` ``submit`` refuses at once with
``Overloaded`` and a retry delay computed from the recent drain rate. A text whose deadline passes
while queued is dropped (``DeadlineExceeded``). A watchdog marks the worker stalled when one batch
runs past ``stall_timeout_s`` and fails queued texts at once while it is.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.engine.types import GenerationRequest, GenerationResult
from service.errors import (
    DeadlineExceeded,
    EngineStalled,
    EngineUnavailable,
    GenerationFailed,
    OutOfMemory,
    Overloaded,
    ServiceError,
)
from service.metrics import Metrics
from service.scheduling.types import Scheduled, check_admission

log = logging.getLogger(__name__)


class BatchRunner(Protocol):
    """Runs one batch on the model (``EngineWorker`` in production)."""

    async def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]: ...


@dataclass(frozen=True, slots=True)
class BatchingLimits:
    max_batch_size: int
    max_batch_tokens: int
    max_wait_s: float
    max_queue_size: int
    # A batch running longer than this means a hung worker (None: never).
    stall_timeout_s: float | None = None


@dataclass(slots=True, eq=False)
class _Item:
    request: GenerationRequest
    future: asyncio.Future[Scheduled]
    enqueued_at: float = field(default_factory=time.monotonic)


class MicroBatchScheduler:
    """Micro-batches generation requests onto one ``BatchRunner`` (a ``GenerationScheduler``)."""

    def __init__(self, runner: BatchRunner, limits: BatchingLimits, metrics: Metrics) -> None:
        self._runner = runner
        self._limits = limits
        self._metrics = metrics
        self._pending: list[_Item] = []
        self._arrived = asyncio.Event()
        # Set whenever nothing is queued or running: what close() waits for to drain.
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        # Drain rate estimate (items per second), for Retry-After.
        self._drain_rate = 0.0
        self._batch_started: float | None = None
        self._watchdog_task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._pending)

    @property
    def stalled(self) -> bool:
        """Whether the worker has been inside one batch for longer than the stall timeout."""
        timeout = self._limits.stall_timeout_s
        started = self._batch_started
        return timeout is not None and started is not None and time.monotonic() - started > timeout

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="scheduler")
        if self._watchdog_task is None and self._limits.stall_timeout_s is not None:
            self._watchdog_task = asyncio.create_task(self._watchdog(), name="watchdog")

    async def submit(self, request: GenerationRequest, deadline: float | None = None) -> Scheduled:
        """Queue one request and wait for its result, until ``deadline`` (monotonic) at most."""
        check_admission(
            closed=self._closed,
            stalled="the model worker is stalled; retry on another replica"
            if self.stalled
            else None,
            deadline=deadline,
            metrics=self._metrics,
        )
        if len(self._pending) >= self._limits.max_queue_size:
            self._metrics.queue_rejections.labels(reason="queue_full").inc()
            raise Overloaded(
                f"the queue is full ({self._limits.max_queue_size} texts waiting)",
                retry_after_s=self.retry_after_s(),
            )
        item = _Item(request, asyncio.get_running_loop().create_future())
        self._pending.append(item)
        self._metrics.queue_depth.set(len(self._pending))
        self._idle.clear()
        self._arrived.set()
        try:
            if deadline is None:
                return await item.future
            # On timeout wait_for cancels the future: a queued item is then dropped before the
            # model ever sees it.
            return await asyncio.wait_for(item.future, deadline - time.monotonic())
        except TimeoutError:
            self._metrics.queue_rejections.labels(reason="deadline").inc()
            raise DeadlineExceeded("the request's deadline passed before it finished") from None
        except asyncio.CancelledError:
            self._metrics.queue_rejections.labels(reason="cancelled").inc()
            raise

    def retry_after_s(self) -> float:
        """Seconds until the current queue has likely drained, at least one."""
        if self._drain_rate <= 0:
            return 1.0
        return max(1.0, math.ceil(len(self._pending) / self._drain_rate))

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, let queued work finish for up to ``drain_timeout_s``, fail the rest."""
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        except TimeoutError:
            log.warning("drain timed out", extra={"queued": len(self._pending)})
        for task in (self._loop_task, self._watchdog_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._fail(self._pending, EngineUnavailable("the service shut down before this ran"))
        self._pending.clear()
        self._metrics.queue_depth.set(0)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._idle.set()
                self._arrived.clear()
                await self._arrived.wait()
            await self._wait_to_fill()
            batch = self._take_batch()
            self._metrics.queue_depth.set(len(self._pending))
            if batch:
                await self._execute(batch)

    async def _wait_to_fill(self) -> None:
        if not self._pending:
            return
        flush_at = self._pending[0].enqueued_at + self._limits.max_wait_s
        while len(self._pending) < self._limits.max_batch_size:
            remaining = flush_at - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self) -> list[_Item]:
        # Done already: the caller left or its deadline passed (counted where it waited).
        live = [item for item in self._pending if not item.future.done()]
        if not live:
            self._pending = []
            return []
        anchor = live[0]
        anchor_len = len(anchor.request.prompt_ids)
        candidates = sorted(
            (item for item in live[1:] if item.request.decoding == anchor.request.decoding),
            key=lambda item: abs(len(item.request.prompt_ids) - anchor_len),
        )
        batch = [anchor]
        width = anchor_len
        for item in candidates:
            if len(batch) >= self._limits.max_batch_size:
                break
            new_width = max(width, len(item.request.prompt_ids))
            if new_width * (len(batch) + 1) > self._limits.max_batch_tokens:
                continue
            batch.append(item)
            width = new_width
        chosen = set(map(id, batch))
        self._pending = [item for item in live if id(item) not in chosen]
        return batch

    async def _execute(self, batch: list[_Item]) -> None:
        batch = [item for item in batch if not item.future.done()]
        if not batch:
            return
        started = time.monotonic()
        for item in batch:
            self._metrics.queue_wait.observe(started - item.enqueued_at)
        self._metrics.batch_size.observe(len(batch))
        self._batch_started = started
        try:
            results = await self._runner.generate([item.request for item in batch])
            if len(results) != len(batch):
                raise GenerationFailed("the engine returned a wrong number of results")
        except asyncio.CancelledError:
            self._fail(batch, EngineUnavailable("the service shut down during this batch"))
            raise
        except OutOfMemory as error:
            self._metrics.batch_failures.labels(code=error.code).inc()
            if len(batch) == 1:
                self._fail(batch, error)
                return
            # Retry in halves down to single texts: only a text too big alone fails.
            half = len(batch) // 2
            log.warning("out of memory; splitting the batch", extra={"batch_size": len(batch)})
            await self._execute(batch[:half])
            await self._execute(batch[half:])
            return
        except ServiceError as error:
            self._metrics.batch_failures.labels(code=error.code).inc()
            self._fail(batch, error)
            return
        except Exception:
            log.exception("batch failed", extra={"batch_size": len(batch)})
            self._metrics.batch_failures.labels(code=GenerationFailed.code).inc()
            self._fail(batch, GenerationFailed("the model failed to generate"))
            return
        finally:
            self._batch_started = None
        elapsed = time.monotonic() - started
        self._metrics.inference_duration.observe(elapsed)
        self._note_drain(len(batch), elapsed)
        for item, result in zip(batch, results, strict=True):
            self._metrics.prompt_tokens.inc(result.prompt_tokens)
            self._metrics.generated_tokens.inc(result.completion_tokens)
            if not item.future.done():
                item.future.set_result(Scheduled(result, started - item.enqueued_at, elapsed))

    async def _watchdog(self) -> None:
        """While the worker is stalled, fail queued texts at once instead of letting them wait."""
        assert self._limits.stall_timeout_s is not None
        period = max(0.05, self._limits.stall_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            if self.stalled and self._pending:
                log.error("model worker stalled", extra={"queued": len(self._pending)})
                self._fail(self._pending, EngineStalled("the model worker is stalled"))
                self._pending = []
                self._metrics.queue_depth.set(0)

    def _note_drain(self, items: int, seconds: float) -> None:
        rate = items / max(seconds, 1e-6)
        self._drain_rate = rate if self._drain_rate == 0 else 0.8 * self._drain_rate + 0.2 * rate

    @staticmethod
    def _fail(items: Sequence[_Item], error: ServiceError) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
