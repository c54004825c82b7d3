"""What the translator needs from a scheduler, whichever batching strategy runs under it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from service.engine.types import GenerationRequest, GenerationResult


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
