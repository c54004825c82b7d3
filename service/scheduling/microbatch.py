"""The asyncio micro-batching queue in front of the engine worker.

Each submitted request gets one future. A single loop task forms batches: it waits until
``max_batch_size`` texts are queued or the oldest has waited ``max_wait_ms``, then takes the oldest
text plus the queued texts nearest to it in prompt length (less padding), within the batch's row and
token bounds, and hands them to the worker. While the worker runs a batch the queue fills, so
under load batches form without waiting. Items whose caller has gone (their future was cancelled)
are dropped before they reach the model. A failed batch fails each of its items with a typed
error and the loop goes on; a batch that runs out of memory is retried in halves down to single
texts. A text whose deadline passes while queued is dropped (``DeadlineExceeded``).

It runs inside the engine process. Admission (how much may queue), Retry-After and the stall
watchdog belong to the API process's policy layer (``service.policy``), which sees this
scheduler only through the engine's reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.engine.config import BatchingConfig
from service.engine.types import GenerationRequest, GenerationResult, TextSink
from service.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    GenerationFailed,
    OutOfMemory,
    ServiceError,
)
from service.scheduling.types import Scheduled, check_admission

log = logging.getLogger(__name__)


class BatchRunner(Protocol):
    """Runs one batch on the model (``EngineWorker`` in production)."""

    async def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]: ...


@dataclass(slots=True, eq=False)
class _Item:
    request: GenerationRequest
    future: asyncio.Future[Scheduled]
    enqueued_at: float = field(default_factory=time.monotonic)


class MicroBatchScheduler:
    """Micro-batches generation requests onto one ``BatchRunner`` (a ``GenerationScheduler``)."""

    def __init__(self, runner: BatchRunner, limits: BatchingConfig) -> None:
        self._runner = runner
        self._limits = limits
        self._pending: list[_Item] = []
        self._arrived = asyncio.Event()
        # Set whenever nothing is queued or running: what close() waits for to drain.
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._running = 0

    @property
    def capacity(self) -> int:
        return self._limits.max_batch_size

    @property
    def running(self) -> int:
        return self._running

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="scheduler")

    async def submit(
        self,
        request: GenerationRequest,
        deadline: float | None = None,
        on_text: TextSink | None = None,
    ) -> Scheduled:
        """Queue one request and wait for its result, until ``deadline`` (monotonic) at most.
        ``on_text`` is not called: ``generate()`` answers a batch whole (a stream gets the
        text at the end)."""
        check_admission(closed=self._closed, deadline=deadline)
        item = _Item(request, asyncio.get_running_loop().create_future())
        self._pending.append(item)
        self._idle.clear()
        self._arrived.set()
        try:
            if deadline is None:
                return await item.future
            # On timeout wait_for cancels the future: a queued item is then dropped before the
            # model ever sees it.
            return await asyncio.wait_for(item.future, deadline - time.monotonic())
        except TimeoutError:
            raise DeadlineExceeded("the request's deadline passed before it finished") from None

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, let queued work finish for up to ``drain_timeout_s``, fail the rest."""
        self._closed = True
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            except TimeoutError:
                log.warning("drain timed out", extra={"queued": len(self._pending)})
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail(self._pending, EngineUnavailable("the service shut down before this ran"))
        self._pending.clear()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._idle.set()
                self._arrived.clear()
                await self._arrived.wait()
            await self._wait_to_fill()
            batch = self._take_batch()
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
        self._running = len(batch)
        try:
            results = await self._runner.generate([item.request for item in batch])
            if len(results) != len(batch):
                raise GenerationFailed("the engine returned a wrong number of results")
        except asyncio.CancelledError:
            self._fail(batch, EngineUnavailable("the service shut down during this batch"))
            raise
        except OutOfMemory as error:
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
            self._fail(batch, error)
            return
        except Exception:
            log.exception("batch failed", extra={"batch_size": len(batch)})
            self._fail(batch, GenerationFailed("the model failed to generate"))
            return
        finally:
            self._running = 0
        elapsed = time.monotonic() - started
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(Scheduled(result, started - item.enqueued_at, elapsed))

    @staticmethod
    def _fail(items: Sequence[_Item], error: ServiceError) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
