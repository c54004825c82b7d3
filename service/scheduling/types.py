"""What the translator needs from a scheduler, whichever batching strategy runs under it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from service.engine.types import GenerationRequest, GenerationResult
from service.errors import DeadlineExceeded, EngineStalled, EngineUnavailable
from service.metrics import Metrics


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A generation result with the time it spent waiting and running."""

    result: GenerationResult
    queue_s: float
    inference_s: float


class GenerationScheduler(Protocol):
    """Admits generation requests, bounded, and answers each with its result."""

    @property
    def depth(self) -> int:
        """Texts accepted and not yet answered (queued or, for continuous batching, running)."""
        ...

    @property
    def stalled(self) -> bool:
        """Whether the engine stopped making progress (hung or dead): not ready, not live."""
        ...

    def start(self) -> None: ...

    async def submit(self, request: GenerationRequest, deadline: float | None = None) -> Scheduled:
        """The result of ``request``; raises ``Overloaded`` at once when over capacity and
        ``DeadlineExceeded`` once ``deadline`` (``time.monotonic()``) passes."""
        ...

    def retry_after_s(self) -> float: ...

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, finish accepted work for up to ``drain_timeout_s``, fail the rest."""
        ...


def check_admission(
    *, closed: bool, stalled: str | None, deadline: float | None, metrics: Metrics
) -> None:
    """Raise why a new request cannot be accepted now: shutting down, stalled (``stalled`` is
    the reason), or its deadline (``time.monotonic()``) already past."""
    if closed:
        raise EngineUnavailable("the service is shutting down")
    if stalled is not None:
        raise EngineStalled(stalled)
    if deadline is not None and deadline <= time.monotonic():
        metrics.queue_rejections.labels(reason="deadline").inc()
        raise DeadlineExceeded("the request's deadline passed before it was queued")
