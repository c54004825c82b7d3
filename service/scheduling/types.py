"""The one contract of the engine process's schedulers, whichever batching strategy runs.

``MicroBatchScheduler`` (static batches through ``model.generate()``) and
``ContinuousScheduler`` (transformers' continuous batching) both implement it; the engine process
drives whichever was loaded through it alone, and reports ``capacity`` and ``running`` in its
stats so the API process's admission can reason about either the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from service.engine.types import GenerationRequest, GenerationResult, TextSink
from service.errors import DeadlineExceeded, EngineUnavailable


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A generation result with the time it spent waiting and running."""

    result: GenerationResult
    queue_s: float
    inference_s: float


class GenerationScheduler(Protocol):
    """Takes generation requests and answers each with its result."""

    @property
    def capacity(self) -> int:
        """Most texts generating at once (batch size, or requests per step)."""
        ...

    @property
    def running(self) -> int:
        """Texts generating right now."""
        ...

    def start(self) -> None: ...

    async def submit(
        self,
        request: GenerationRequest,
        deadline: float | None = None,
        on_text: TextSink | None = None,
    ) -> Scheduled:
        """The result of ``request``; ``DeadlineExceeded`` once ``deadline``
        (``time.monotonic()``) passes. Cancelling the caller cancels the generation.
        ``on_text``: called with the text so far while it grows, where the engine streams."""
        ...

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, finish accepted work for up to ``drain_timeout_s``, fail the rest."""
        ...


def check_admission(*, closed: bool, deadline: float | None) -> None:
    """Raise why a new request cannot be taken now: shutting down, or its deadline
    (``time.monotonic()``) already past."""
    if closed:
        raise EngineUnavailable("the service is shutting down")
    if deadline is not None and deadline <= time.monotonic():
        raise DeadlineExceeded("the request's deadline passed before it was queued")
