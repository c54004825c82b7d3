"""One step of the fast engine: the scheduler plans, the model runner executes, the tokens go back.

``Stepper`` holds the one decode step in flight. A decode step's tokens are read one turn later,
so the host's bookkeeping overlaps the next step instead of leaving the device idle. The next
step is launched before the host knows which rows the previous one finished: when some did, the
rows are packed down at once (on the device, after the step in flight: the stream keeps the
order), and the step in flight, which ran in the rows as they were, is read a turn later through
that move, its tokens of the finished rows dropped. A prefill is launched before the decode step
and its first tokens are read after it is launched: the prompts that completed join the rows
(after the packing) while the device decodes, and decode from the next step on. The host never
waits for a step it has just launched. One speculative token stays inside a request's committed
pages (its budget's last position is never written by the step that produces the last token).

The runner and the output processor are protocols here, so the scheduler's tests drive this same
step with a fake device and no model.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from service.contract.errors import DeadlineExceeded, ServiceError
from service.engine.fast.scheduler import (
    Chunk,
    DecodePlan,
    Finished,
    Joined,
    Retired,
    Scheduler,
)
from service.engine.fast.sequence import Sequence


class InFlight(Protocol):
    """A launched decode step: how many rows it ran."""

    @property
    def rows(self) -> int: ...


Step = TypeVar("Step", bound=InFlight)


Firsts = TypeVar("Firsts")


class Device(Protocol[Step, Firsts]):
    """What the step needs of the model runner: ``prefill`` launches a prefill, ``firsts``
    reads the first tokens of its completed prompts (waiting for it, not for what follows)."""

    def prefill(self, chunks: list[Chunk]) -> Firsts: ...

    def firsts(self, pending: Firsts) -> list[int]: ...

    def join(self, joined: Joined) -> None: ...

    def launch(self, plan: DecodePlan) -> Step: ...

    def collect(self, step: Step) -> np.ndarray: ...

    def retire(self, retired: Retired) -> None: ...


class Answers(Protocol):
    """What the step needs of the output processor."""

    def joined(self, joined: Joined) -> None: ...

    def stream(self, pieces: Iterable[tuple[str, int]]) -> None: ...

    def finish(self, finished: Seq[Finished]) -> None: ...

    def forget(self, request_ids: Iterable[str]) -> None: ...

    def fail(self, sequences: Iterable[Sequence], error: ServiceError) -> None: ...


@dataclass(slots=True)
class StepTimes:
    """Where the step loop's time went, summed since start (seconds): the prefill (planned,
    run, first tokens read: the one read that waits for the device), the decode launch (planned
    and enqueued), the wait for the step before it (``collect``: the host idle while the device
    works), and the host's own work on the tokens (rows, retire, text, answers). The wait's share
    of the whole is how much of the loop the device kept the host waiting: near zero, the device
    waited for the host instead. Also counted: the steps that prefilled, their prompt tokens and
    those reused from kept prefixes, and the rows of every decode step (their mean is how full
    the batch ran). The device's own time on prefills and decode steps (``device_clock``) is
    filled in where it is measured."""

    steps: int = 0
    decodes: int = 0
    prefills: int = 0
    prefill_tokens: int = 0
    # Prompt tokens whose keys and values came from kept prefixes instead (not in the above).
    reused_tokens: int = 0
    # Prefill steps replayed as a captured graph (``prefill_graphs.py``), of ``prefills``.
    graph_prefills: int = 0
    decode_rows: int = 0
    device_prefill_s: float = 0.0
    device_decode_s: float = 0.0
    # Bucket -> (device seconds, decode steps).
    device_decode_by_bucket: dict[int, tuple[float, int]] = field(default_factory=dict)
    prefill_s: float = 0.0
    # Of ``prefill_s``: the host launching the prefills (laying them out, enqueuing their
    # kernels or replaying their graphs, the first tokens' sampling), the rest being the
    # scheduler's planning, the wait for the first tokens and the join. Where a launch outlasts
    # the decode step in flight, the device waits for the host.
    prefill_launch_s: float = 0.0
    launch_s: float = 0.0
    wait_s: float = 0.0
    host_s: float = 0.0


class Stepper(Generic[Step, Firsts]):
    def __init__(self, scheduler: Scheduler, device: Device[Step, Firsts], output: Answers) -> None:
        self._scheduler = scheduler
        self._device = device
        self._output = output
        self._inflight: Step | None = None
        # Rows packed down since the step in flight was launched: read it through this move.
        self._moved: Retired | None = None
        self.times = StepTimes()

    def busy(self) -> bool:
        """Whether a step has anything to do."""
        return self._scheduler.has_work() or self._inflight is not None

    def step(self) -> None:
        """One prefill (if a prompt waits) and one decode step."""
        scheduler, device, times = self._scheduler, self._device, self.times
        began = time.perf_counter()
        times.steps += 1
        chunks = scheduler.schedule_prefill()
        expired = scheduler.take_expired()
        if expired:
            passed = DeadlineExceeded("the request's deadline passed while it waited")
            self._output.fail(expired, passed)
        pending = None
        if chunks:
            times.prefills += 1
            times.prefill_tokens += sum(chunk.count for chunk in chunks)
            times.reused_tokens += sum(c.reuse.tokens for c in chunks if c.reuse is not None)
            launching = time.perf_counter()
            pending = device.prefill(chunks)
            times.prefill_launch_s += time.perf_counter() - launching
        planned = time.perf_counter()
        times.prefill_s += planned - began
        plan = scheduler.schedule_decode()
        launched = device.launch(plan) if plan is not None else None
        if launched is not None:
            times.decodes += 1
            times.decode_rows += launched.rows
        previous, self._inflight = self._inflight, launched
        moved, self._moved = self._moved, None
        waiting = time.perf_counter()
        times.launch_s += waiting - planned
        if previous is not None:
            tokens, rows = device.collect(previous), previous.rows
            collected = time.perf_counter()
            times.wait_s += collected - waiting
            self._take(tokens, rows, moved, launched)
            waiting = time.perf_counter()
            times.host_s += waiting - collected
        if pending is not None:
            # After the packing: the prompts that completed take the rows after the kept ones.
            self._join([c.sequence for c in chunks if c.completes], device.firsts(pending))
            times.prefill_s += time.perf_counter() - waiting

    def _join(self, completing: list[Sequence], firsts: list[int]) -> None:
        """Prompts whose prefill ended, with their first tokens, into the rows."""
        if firsts:
            joined = self._scheduler.join(completing, firsts)
            self._device.join(joined)
            self._output.joined(joined)

    def _take(
        self, tokens: np.ndarray, rows: int, moved: Retired | None, launched: Step | None
    ) -> None:
        """A collected step's tokens into the rows, the finished ones answered."""
        scheduler = self._scheduler
        if moved is not None:
            tokens, rows = moved.remap(tokens)
        update = scheduler.update(rows, tokens)
        self._output.stream(update.streamed)
        if update.finished:
            retired = scheduler.retire(sorted(update.finished))
            self._device.retire(retired)
            if launched is not None:
                self._moved = retired
            self._output.forget(retired.dropped)
            self._output.finish(retired.finished)

    def fail_all(self, failure: ServiceError) -> None:
        """Answer every request held with ``failure`` (a step failed) and start clean."""
        self._inflight = None
        self._moved = None
        retired, failed = self._scheduler.fail_all()
        self._device.retire(retired)
        self._output.forget(retired.dropped)
        self._output.fail(failed, failure)
