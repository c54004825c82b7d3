"""Admission: whether a request may enter, decided in O(1) before any per-text work.

The API process counts every text it admitted and has not answered (``in_flight``): that count
is exact, it needs no message from the engine. A request for ``n`` texts is refused at once
(``Overloaded``, 429) when

- ``in_flight + n`` would pass ``max_in_flight`` (the configured bound), or
- it would likely not finish inside its own deadline. While the engine has a free decode row
  for every text in flight (``capacity``, from the engine's ``Ready``) such a text starts at
  once, and the estimate is one generation at that batch size (from the engine's own step
  times): it refuses nothing on an engine that finishes a full batch in time, and stops a
  slow engine's batch where it would not. Past that, by Little's law a text admitted now is
  answered after about ``(in_flight + n) / rate``, where ``rate`` is the texts the engine answers
  per second *of busy time* (time with anything in flight): idle time is left out, so a lightly
  loaded engine is not mistaken for a slow one, and under saturation it is the engine's
  throughput. The estimate must fit in ``_DEADLINE_SHARE`` of the time left, leaving room for
  the spread of output lengths. Admitting what cannot finish in time only turns a 429 now into
  a 504 later, and spends GPU time on answers nobody receives.

The rate and the expected finish come from ``drain.DrainEstimate``: measured from answers once
the engine has been busy for a generation at a full batch, before that from the engine's own step
times at start.

A request of several texts that would not finish inside its deadline even alone, on an idle
engine, where one text would, is refused as too large (``BatchTooLarge``, a 4xx in each API's
shape) rather than as a wait: retrying it after any Retry-After would be refused again, and
fewer texts a request get through.

``retry_after_s`` is the one estimator of Retry-After for every refusal: the time the current
backlog needs to drain at that rate.

With several API processes in front of one engine each process admits its share: the bound and
the capacity are divided by the number of processes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TypeVar

from service.contract.errors import (
    BatchTooLarge,
    DeadlineExceeded,
    EngineDied,
    EngineUnavailable,
    NotReady,
    Overloaded,
    ServiceError,
)
from service.frontend.metrics import Children, Metrics
from service.frontend.policy.drain import DrainEstimate

# The expected wait may take this share of the time left to the deadline.
_DEADLINE_SHARE = 0.6
# A refusal (its message and Retry-After) is used again for this long while nothing changes.
_REFUSAL_TTL_S = 0.1


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
        most_tokens: int | None = None,
    ) -> None:
        """``processes``: API processes sharing the engine, each admitting its share;
        ``most_tokens``: the most a text may generate (the service's ``max_new_tokens``)."""
        self._drain = DrainEstimate(clock, processes, most_tokens)
        self._max = max(1, max_in_flight // processes)
        self._metrics = metrics
        self._availability = availability
        self._clock = clock
        self._in_flight = 0
        self._arriving = 0
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._rejections = Children(metrics.queue_rejections)
        # Refusals for a full queue not yet in the metrics: counted at the next change of the
        # texts in flight (a flood's admitted texts answered) or rendering of the metrics.
        self._unrecorded_refusals = 0
        metrics.before_render.append(self.count_refusals)
        # The last refusal: texts in flight then, when, and the error.
        self._refused: tuple[int, float, Overloaded] | None = None

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

    def set_engine(self, capacity: int, step_seconds: Mapping[int, float] | None = None) -> None:
        """Texts the engine generates at once, and the seconds of its decode step by batch size
        (from its ``Ready``; none where it did not measure them)."""
        self._drain.set_engine(capacity, step_seconds)

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
        """The refusal for a request turned away while ``full``, before its body is read: the
        same one while the texts in flight stay as many, for ``_REFUSAL_TTL_S`` at most (a
        flood's refusals come by the thousand, and working out Retry-After each time was a
        noticeable share of what one cost). Counted in the metrics later (``count_refusals``),
        not between one refusal and the next."""
        self._unrecorded_refusals += 1
        now = self._clock()
        last = self._refused
        if last is None or last[0] != self._in_flight or now - last[1] >= _REFUSAL_TTL_S:
            error = Overloaded(
                f"{self._in_flight} texts in flight, at most {self._max}",
                retry_after_s=self.retry_after_s(),
            )
            self._refused = last = (self._in_flight, now, error)
        return last[2]

    def reserve(self, texts: int, deadline: float | None, segments: bool = False) -> Reservation:
        """Admit ``texts`` texts or raise why not; O(1), before any per-text work.
        ``segments``: they are one long text's (a refusal as too large says so: the client
        sent one text, and can only send it in shorter parts)."""
        if self._closed:
            raise EngineUnavailable("the service is shutting down; retry on another replica")
        unavailable = self._availability()
        if unavailable is not None:
            raise unavailable
        now = self._clock()
        if deadline is not None and deadline <= now:
            self._reject("deadline")
            raise DeadlineExceeded("the request's deadline passed before it was admitted")
        if texts > self._max:
            # Never admissible, however empty the queue: a 429 would bring it back unchanged.
            self._reject("queue_full")
            raise BatchTooLarge(
                f"{texts} {'segments' if segments else 'texts'}, more than the {self._max} the "
                f"queue holds at once; "
                + ("send the text in shorter parts" if segments else "send fewer texts per request")
            )
        if self._in_flight + texts > self._max:
            self._reject("queue_full")
            raise Overloaded(
                f"{self._in_flight} texts in flight, at most {self._max}",
                retry_after_s=self.retry_after_s(),
            )
        if deadline is not None:
            allowed = _DEADLINE_SHARE * (deadline - now)
            expected = self._drain.finish_s(self._in_flight + texts, now)
            if expected is not None and expected > allowed:
                self._reject("deadline_unreachable")
                alone = self._drain.too_large(texts, now, allowed) if texts > 1 else None
                if alone is not None:
                    # Waiting would not help: an idle engine would not finish it in time
                    # either, and a 429 would send the client back with the same request.
                    what, advice = (
                        ("segments", "send the text in shorter parts")
                        if segments
                        else ("texts", "send fewer texts per request")
                    )
                    raise BatchTooLarge(
                        f"{texts} {what} would take about {alone:.1f} s even on an idle "
                        f"service, more than this request's deadline allows; {advice}"
                    )
                raise Overloaded(
                    f"the backlog would take about {expected:.1f} s, more than this "
                    f"request's deadline allows",
                    retry_after_s=self.retry_after_s(),
                )
        self._enter(texts, now)
        return Reservation(self, texts)

    def completed(self, tokens: int | None = None) -> None:
        """One text was answered by the engine (whatever the outcome); ``tokens``: the tokens
        it generated, where it has a result."""
        self._drain.answered(self._in_flight, tokens)

    def drain_rate(self) -> float | None:
        """Texts answered per second of busy time (measured, or the engine's prior), or None
        before either is known."""
        return self._drain.rate()

    def retry_after_s(self) -> float:
        """Seconds until the current backlog has likely drained: at least 1, at most 60."""
        rate = self.drain_rate()
        if not self._in_flight or rate is None:
            return 1.0
        return float(min(60, max(1, math.ceil(self._in_flight / rate))))

    def _enter(self, texts: int, now: float) -> None:
        self._drain.advance(now)
        if not self._in_flight and texts:
            self._drain.busy(now)
        self._in_flight += texts
        self._idle.clear()
        self._metrics.in_flight.set(self._in_flight)
        self.count_refusals()

    def _leave(self, texts: int) -> None:
        self._drain.advance(self._clock())
        self._in_flight -= texts
        if not self._in_flight:
            self._drain.idle()
            self._idle.set()
        self._metrics.in_flight.set(self._in_flight)
        self.count_refusals()

    def _reject(self, reason: str, texts: int = 1) -> None:
        self._rejections(reason).inc(texts)

    def count_refusals(self) -> None:
        """The refusals for a full queue made since the last count, into the metrics."""
        if self._unrecorded_refusals:
            self._reject("queue_full", self._unrecorded_refusals)
            self._unrecorded_refusals = 0


_T = TypeVar("_T")
# How often waiting work asks again whether the engine serves (loading or restarting).
_ENGINE_BACK_S = 1.0


async def patiently(attempt: Callable[[], Awaitable[_T]], deadline: float | None) -> _T:
    """``attempt`` until admission has room for it and the engine serves, waiting as long as
    each full queue's ``Retry-After`` says (between 0.2 and 5 s), or a second while the model
    loads or the engine restarts, until the deadline would pass first: for work that may wait
    (an uploaded document, resumed as a service starts), not for a live request, which is
    refused."""
    while True:
        try:
            return await attempt()
        except EngineDied:
            raise  # the work was in the engine when it went: it may be what took it down
        except (Overloaded, NotReady, EngineUnavailable) as refused:
            wait = (
                min(max(refused.retry_after_s, 0.2), 5.0)
                if isinstance(refused, Overloaded)
                else _ENGINE_BACK_S
            )
            if deadline is not None and time.monotonic() + wait > deadline:
                raise
            await asyncio.sleep(wait)
