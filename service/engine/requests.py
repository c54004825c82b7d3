"""The scheduler in front of a continuous-batching engine (inside the engine process).

The engine batches at every decode step, so there is nothing to wait for here: each request goes
to the engine at once. This layer turns the engine's callbacks into awaitable results, cancels a
request in the engine when its caller goes away or its deadline passes, and keeps the counts the
engine process reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from service.contract.errors import DeadlineExceeded, EngineUnavailable, ServiceError
from service.contract.types import (
    Engine,
    GenerationRequest,
    GenerationResult,
    Scheduled,
    TextSink,
)


def check_admission(*, closed: bool, deadline: float | None) -> None:
    """Raise why a new request cannot be taken now: shutting down, or its deadline
    (``time.monotonic()``) already past."""
    if closed:
        raise EngineUnavailable("the service is shutting down")
    if deadline is not None and deadline <= time.monotonic():
        raise DeadlineExceeded("the request's deadline passed before it was queued")


# Requests per step when the engine does not say (transformers decides it from memory).
_DEFAULT_CAPACITY = 256


class PendingRequests:
    """Pass-through to an ``Engine``: awaitable results, deadlines and cancels."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._in_flight = 0
        self._ids = itertools.count()
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._futures: dict[str, asyncio.Future[Scheduled]] = {}

    @property
    def capacity(self) -> int:
        return self._engine.capacity() or _DEFAULT_CAPACITY

    @property
    def running(self) -> int:
        running = self._engine.running()
        return self._in_flight if running is None else min(running, self._in_flight)

    async def submit(
        self,
        request: GenerationRequest,
        deadline: float | None = None,
        on_text: TextSink | None = None,
    ) -> Scheduled:
        check_admission(closed=self._closed, deadline=deadline)
        if not self._engine.is_alive():
            raise EngineUnavailable("the generation thread is not running")
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()

        def done(outcome: GenerationResult | ServiceError, queue_s: float, run_s: float) -> None:
            if future.done():
                return
            if isinstance(outcome, ServiceError):
                future.set_exception(outcome)
            else:
                future.set_result(Scheduled(outcome, queue_s, run_s))

        request_id = f"hymt-{next(self._ids)}"
        self._engine.submit(request_id, request, done, on_text, deadline)
        self._futures[request_id] = future
        self._enter()
        try:
            if deadline is None:
                return await future
            return await asyncio.wait_for(future, deadline - time.monotonic())
        except TimeoutError:
            self._engine.cancel(request_id)
            raise DeadlineExceeded("the request's deadline passed before it finished") from None
        except asyncio.CancelledError:
            self._engine.cancel(request_id)
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

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
