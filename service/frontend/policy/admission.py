"""Admission: whether a request may enter, decided in O(1) before any per-text work.

The API process counts every text it admitted and has not answered (``in_flight``): that count
is exact, it needs no message from the engine. A request for ``n`` texts is refused at once
(``Overloaded``, 429) when

- ``in_flight + n`` would pass ``max_in_flight`` (the configured bound), or
- it would likely not finish inside its own deadline. By Little's law a text admitted now is
  answered after about ``(in_flight + n) / rate``, where ``rate`` is the texts the engine answers
  per second *of busy time* (time with anything in flight): idle time is left out, so a lightly
  loaded engine is not mistaken for a slow one, and under saturation it is the engine's
  throughput. With continuous batching this also covers the case where everything admitted
  runs at once but the batch is so large that each step is slow. The estimate must fit in
  ``_DEADLINE_SHARE`` of the time left, leaving room for the spread of output lengths. Admitting
  what cannot finish in time only turns a 429 now into a 504 later, and spends GPU time on
  answers nobody receives.

A rate measured while few texts were in flight says little about a larger batch: a batching
engine answers more texts per second the more it holds, up to what it generates at once
(``capacity``, from the engine's ``Ready``). So the rate is scaled by half of how much more the
engine would batch than it did while measured, never below the measured rate: a burst after a
quiet spell is estimated at the engine's per-text latency, not refused for the lone requests'
rate. "While measured" is the in-flight count each answer came out at, averaged over the same
decaying answers as the rate: a burst still arriving has no answers yet, so it cannot count as
the load its predecessors' rate was measured at.

``retry_after_s`` is the one estimator of Retry-After for every refusal: the time the current
backlog needs to drain at that rate.

With several API processes in front of one engine each process admits its share: the bound and
the capacity are divided by the number of processes, and the rate and the load it was measured
at are each process's own, so their ratio stays the engine's.

The rate is a ratio of two exponentially decaying sums (answers, busy seconds) with the same time
constant, updated in O(1) at every admission, answer and release.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from service.contract.errors import DeadlineExceeded, EngineUnavailable, Overloaded, ServiceError
from service.frontend.metrics import Children, Metrics

# Time constant of the rate's decaying sums, and the (decayed) answers it needs to be trusted.
_RATE_TAU_S = 5.0
_MIN_ANSWERS = 3.0
# The expected wait may take this share of the time left to the deadline.
_DEADLINE_SHARE = 0.6


class Reservation:
    """Slots held by one request; released text by text as each is answered, the rest on exit."""

    def __init__(self, admission: Admission, texts: int) -> None:
        self._admission = admission
        self._held = texts

    def release(self, texts: int = 1) -> None:
        texts = min(texts, self._held)
        if texts > 0:
            self._held -= texts
            self._admission._leave(texts)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, asyncio.CancelledError) and self._held:
            # The client left: every text of it not yet answered was dropped, wherever it was.
            self._admission._reject("cancelled", self._held)
        self.release(self._held)


class Admission:
    """Admits requests against the in-flight bound and the engine's drain rate."""

    def __init__(
        self,
        max_in_flight: int,
        metrics: Metrics,
        availability: Callable[[], ServiceError | None],
        clock: Callable[[], float] = time.monotonic,
        processes: int = 1,
    ) -> None:
        """``processes``: API processes sharing the engine, each admitting its share."""
        self._processes = processes
        self._max = max(1, max_in_flight // processes)
        self._metrics = metrics
        self._availability = availability
        self._clock = clock
        self._in_flight = 0
        self._arriving = 0
        self._closed = False
        self._capacity = 1
        # Decaying sums of answers, of busy seconds and of the in-flight count at each answer,
        # as of ``_updated``.
        self._answers = 0.0
        self._busy_s = 0.0
        self._answered_at = 0.0
        self._updated = clock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._rejections = Children(metrics.queue_rejections)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight, for ``timeout_s`` at most; whether it got there."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse everything from now on (shutdown)."""
        self._closed = True

    def set_capacity(self, capacity: int) -> None:
        """Texts the engine generates at once (from its ``Ready``)."""
        self._capacity = max(1, capacity // self._processes)

    @property
    def limit(self) -> int:
        """Most texts this process admits at once."""
        return self._max

    @property
    def full(self) -> bool:
        """Whether any request would be refused for the in-flight bound right now, counting
        the requests on their way here (``arrive``) as one text each."""
        return self._in_flight + self._arriving >= self._max

    def arrive(self) -> Callable[[], None]:
        """Count one request on its way to ``reserve`` (read, not yet started) until the
        returned callable is called: a burst closes the door once its admitted share has
        arrived, not only once each of them has got as far as ``reserve``."""
        self._arriving += 1
        done = False

        def arrived() -> None:
            nonlocal done
            if not done:
                done = True
                self._arriving -= 1

        return arrived

    def refusal(self) -> Overloaded:
        """The refusal for a request turned away while ``full``, before its body is read."""
        self._reject("queue_full")
        return Overloaded(
            f"{self._in_flight} texts in flight, at most {self._max}",
            retry_after_s=self.retry_after_s(),
        )

    def reserve(self, texts: int, deadline: float | None) -> Reservation:
        """Admit ``texts`` texts or raise why not; O(1), before any per-text work."""
        if self._closed:
            raise EngineUnavailable("the service is shutting down; retry on another replica")
        unavailable = self._availability()
        if unavailable is not None:
            raise unavailable
        now = self._clock()
        if deadline is not None and deadline <= now:
            self._reject("deadline")
            raise DeadlineExceeded("the request's deadline passed before it was admitted")
        if self._in_flight + texts > self._max:
            self._reject("queue_full")
            raise Overloaded(
                f"{self._in_flight} texts in flight, at most {self._max}",
                retry_after_s=self.retry_after_s(),
            )
        if deadline is not None:
            expected = self._expected_finish_s(self._in_flight + texts, now)
            if expected is not None and expected > _DEADLINE_SHARE * (deadline - now):
                self._reject("deadline_unreachable")
                raise Overloaded(
                    f"the backlog would take about {expected:.1f} s, more than this "
                    f"request's deadline allows",
                    retry_after_s=self.retry_after_s(),
                )
        self._enter(texts, now)
        return Reservation(self, texts)

    def completed(self) -> None:
        """One text was answered by the engine (whatever the outcome)."""
        self._advance(self._clock())
        self._answers += 1
        self._answered_at += self._in_flight

    def drain_rate(self) -> float | None:
        """Texts answered per second of busy time, or None before it is known."""
        self._advance(self._clock())
        if self._answers < _MIN_ANSWERS or self._busy_s <= 0:
            return None
        return self._answers / self._busy_s

    def retry_after_s(self) -> float:
        """Seconds until the current backlog has likely drained: at least 1, at most 60."""
        rate = self.drain_rate()
        if not self._in_flight or rate is None:
            return 1.0
        return float(min(60, max(1, math.ceil(self._in_flight / rate))))

    def _expected_finish_s(self, position: int, now: float) -> float | None:
        rate = self.drain_rate()
        if rate is None:
            return None
        measured_at = self._answered_at / self._answers  # in flight, on average, at an answer
        batched = min(position, self._capacity)
        # Halved: near saturation more in flight no longer buys proportionally more throughput,
        # and an estimate that is too kind turns into 504s.
        return position / (rate * max(1.0, batched / (2 * max(measured_at, 1.0))))

    def _advance(self, now: float) -> None:
        """Decay both sums to ``now``, counting the busy time since the last update."""
        elapsed = now - self._updated
        if elapsed <= 0:
            return
        decay = math.exp(-elapsed / _RATE_TAU_S)
        self._answers *= decay
        # Busy seconds in (updated, now], decayed as if spread evenly over it.
        busy = _RATE_TAU_S * (1 - decay) if self._in_flight else 0.0
        self._busy_s = self._busy_s * decay + busy
        self._answered_at *= decay
        self._updated = now

    def _enter(self, texts: int, now: float) -> None:
        self._advance(now)
        self._in_flight += texts
        self._idle.clear()
        self._metrics.in_flight.set(self._in_flight)

    def _leave(self, texts: int) -> None:
        self._advance(self._clock())
        self._in_flight -= texts
        if not self._in_flight:
            self._idle.set()
        self._metrics.in_flight.set(self._in_flight)

    def _reject(self, reason: str, texts: int = 1) -> None:
        self._rejections(reason).inc(texts)


_T = TypeVar("_T")


async def patiently(attempt: Callable[[], Awaitable[_T]], deadline: float | None) -> _T:
    """``attempt`` until admission has room for it, waiting as long as each refusal's
    ``Retry-After`` says (between 0.2 and 5 s), or until the deadline would pass first: for
    work that may wait (an uploaded document), not for a live request, which is refused."""
    while True:
        try:
            return await attempt()
        except Overloaded as full:
            wait = min(max(full.retry_after_s, 0.2), 5.0)
            if deadline is not None and time.monotonic() + wait > deadline:
                raise
            await asyncio.sleep(wait)
