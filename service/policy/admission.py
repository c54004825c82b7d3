"""Admission: whether a request may enter, decided in O(1) before any per-text work.

The API process counts every text it admitted and has not answered (``in_flight``): that count
is exact, it needs no message from the engine. A request for ``n`` texts is refused at once
(``Overloaded``, 429) when

- ``in_flight + n`` would pass ``max_in_flight`` (the configured bound), or
- it would likely not finish inside its own deadline: the texts ahead of it beyond what the
  engine generates at once (``capacity``, from its ``Ready``) have to drain first, at the rate
  the engine drains texts while it is saturated, and then its own generation takes about the
  recent per-text generation time. Admitting what cannot finish in time only turns a 429 now
  into a 504 later, and spends GPU time on answers nobody receives.

``retry_after_s`` is the one estimator of Retry-After for every refusal: the time the current
backlog needs to drain.

The drain rate is measured only over time the engine was saturated (texts waiting beyond its
capacity): below saturation, completions measure the arrival rate, not what the engine can do.
Until a saturated period has lasted long enough to measure, the rate is estimated from the
capacity and the recent per-text generation time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

from service.errors import DeadlineExceeded, EngineUnavailable, Overloaded, ServiceError
from service.metrics import Metrics

# A saturated stretch must last this long, with this many completions, to give a rate.
_MIN_SATURATED_S = 0.5
_MIN_COMPLETIONS = 4
_RATE_WINDOW_S = 10.0
# Weight of the newest observation in the per-text generation time's moving average.
_EWMA = 0.1


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
        self.release(self._held)


class Admission:
    """Admits requests against the in-flight bound and the engine's drain rate."""

    def __init__(
        self,
        max_in_flight: int,
        metrics: Metrics,
        availability: Callable[[], ServiceError | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_in_flight
        self._metrics = metrics
        self._availability = availability
        self._clock = clock
        self._in_flight = 0
        self._capacity = 1
        self._closed = False
        self._service_s: float | None = None
        self._completions: deque[float] = deque(maxlen=8192)
        self._saturated_since: float | None = None
        self._idle = asyncio.Event()
        self._idle.set()

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

    def set_capacity(self, capacity: int) -> None:
        """Texts the engine generates at once (from its ``Ready``)."""
        self._capacity = max(1, capacity)

    def close(self) -> None:
        """Refuse everything from now on (shutdown)."""
        self._closed = True

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
            if expected is not None and now + expected > deadline:
                self._reject("deadline_unreachable")
                raise Overloaded(
                    f"the backlog would take about {expected:.1f} s, more than this "
                    f"request's deadline allows",
                    retry_after_s=self.retry_after_s(),
                )
        self._enter(texts, now)
        return Reservation(self, texts)

    def completed(self, inference_s: float | None) -> None:
        """One text was answered by the engine (``inference_s``: its generation time)."""
        now = self._clock()
        self._completions.append(now)
        if inference_s is not None and inference_s > 0:
            self._service_s = (
                inference_s
                if self._service_s is None
                else (1 - _EWMA) * self._service_s + _EWMA * inference_s
            )

    def drain_rate(self) -> float | None:
        """Texts per second the engine answers while saturated, or None before it is known."""
        now = self._clock()
        since = self._saturated_since
        if since is not None and now - since >= _MIN_SATURATED_S:
            start = max(since, now - _RATE_WINDOW_S)
            count = 0
            for instant in reversed(self._completions):
                if instant < start:
                    break
                count += 1
            if count >= _MIN_COMPLETIONS:
                return count / (now - start)
        if self._service_s is not None:
            return self._capacity / self._service_s
        return None

    def retry_after_s(self) -> float:
        """Seconds until the current backlog has likely drained: at least 1, at most 60."""
        waiting = max(0, self._in_flight - self._capacity)
        rate = self.drain_rate()
        if not waiting or rate is None:
            return 1.0
        return float(min(60, max(1, math.ceil(waiting / rate))))

    def _expected_finish_s(self, position: int, now: float) -> float | None:
        waiting = position - self._capacity
        if waiting <= 0:
            return None  # it starts generating at once
        rate = self.drain_rate()
        if rate is None:
            return None
        return waiting / rate + (self._service_s or 0.0)

    def _enter(self, texts: int, now: float) -> None:
        self._in_flight += texts
        self._idle.clear()
        if self._in_flight > self._capacity and self._saturated_since is None:
            self._saturated_since = now
        self._metrics.in_flight.set(self._in_flight)

    def _leave(self, texts: int) -> None:
        self._in_flight -= texts
        if not self._in_flight:
            self._idle.set()
        if self._in_flight <= self._capacity:
            self._saturated_since = None
        self._metrics.in_flight.set(self._in_flight)

    def _reject(self, reason: str) -> None:
        self._metrics.queue_rejections.labels(reason=reason).inc()
