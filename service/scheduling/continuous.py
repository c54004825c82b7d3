"""Admission in front of a continuous-batching engine.

The engine batches at every decode step, so there is nothing to wait for here: each request goes
to the engine at once. This layer bounds how many texts are in the engine (``max_queue_size``,
refusing beyond it with ``Overloaded`` and a drain-rate ``Retry-After``), cancels a request in the
engine when its caller goes away, and records queue wait and generation time per text.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque

from service.engine.types import ContinuousEngine, GenerationRequest, GenerationResult
from service.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    Overloaded,
    ServiceError,
)
from service.metrics import Metrics
from service.scheduling.types import Scheduled, check_admission


class ContinuousScheduler:
    """Bounded pass-through to a ``ContinuousEngine`` (a ``GenerationScheduler``)."""

    def __init__(self, engine: ContinuousEngine, max_in_flight: int, metrics: Metrics) -> None:
        self._engine = engine
        self._max_in_flight = max_in_flight
        self._metrics = metrics
        self._in_flight = 0
        self._ids = itertools.count()
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        # Completion times of recent texts, for the drain rate behind Retry-After.
        self._finished: deque[float] = deque(maxlen=4096)
        self._futures: dict[str, asyncio.Future[Scheduled]] = {}

    @property
    def depth(self) -> int:
        return self._in_flight

    @property
    def stalled(self) -> bool:
        return not self._engine.is_alive()

    def start(self) -> None:
        return None

    def retry_after_s(self) -> float:
        now = time.monotonic()
        recent = sum(1 for t in self._finished if now - t <= 10.0)
        if not recent:
            return 1.0
        rate = recent / 10.0
        return float(max(1, math.ceil(self._in_flight / rate)))

    async def submit(self, request: GenerationRequest, deadline: float | None = None) -> Scheduled:
        check_admission(
            closed=self._closed,
            stalled="the generation thread is not running" if self.stalled else None,
            deadline=deadline,
            metrics=self._metrics,
        )
        if self._in_flight >= self._max_in_flight:
            self._metrics.queue_rejections.labels(reason="queue_full").inc()
            raise Overloaded(
                f"the engine holds {self._in_flight} texts, its limit",
                retry_after_s=self.retry_after_s(),
            )
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()

        def done(outcome: GenerationResult | ServiceError, queue_s: float, run_s: float) -> None:
            if future.done():
                return
            if isinstance(outcome, ServiceError):
                self._metrics.batch_failures.labels(code=outcome.code).inc()
                future.set_exception(outcome)
                return
            self._metrics.queue_wait.observe(queue_s)
            self._metrics.inference_duration.observe(run_s)
            self._metrics.prompt_tokens.inc(outcome.prompt_tokens)
            self._metrics.generated_tokens.inc(outcome.completion_tokens)
            future.set_result(Scheduled(outcome, queue_s, run_s))

        request_id = f"hymt-{next(self._ids)}"
        self._engine.submit(request_id, request, done)
        self._futures[request_id] = future
        self._enter()
        try:
            if deadline is None:
                return await future
            return await asyncio.wait_for(future, deadline - time.monotonic())
        except TimeoutError:
            self._engine.cancel(request_id)
            self._metrics.queue_rejections.labels(reason="deadline").inc()
            raise DeadlineExceeded("the request's deadline passed before it finished") from None
        except asyncio.CancelledError:
            self._engine.cancel(request_id)
            self._metrics.queue_rejections.labels(reason="cancelled").inc()
            raise
        finally:
            self._futures.pop(request_id, None)
            self._leave()

    async def close(self, drain_timeout_s: float) -> None:
        self._closed = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        failure = EngineUnavailable("the service shut down before this finished")
        for future in self._futures.values():
            if not future.done():
                future.set_exception(failure)

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()
        self._metrics.queue_depth.set(self._in_flight)

    def _leave(self) -> None:
        self._in_flight -= 1
        self._finished.append(time.monotonic())
        self._metrics.queue_depth.set(self._in_flight)
        if self._in_flight == 0:
            self._idle.set()
