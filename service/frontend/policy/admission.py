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

The measured rate is trusted only once the engine has been busy for longer than one text's
generation at a full batch: the first answers of a burst into an idle engine are its shortest
texts, and a rate taken from them (three answers after two seconds while a thousand texts
generate) would predict waits of minutes. Until then, and before any answer, the rate comes
from what the engine measured about itself at start (``Ready.step_seconds``, one decode step's
time by batch size): a full batch answers ``capacity`` texts every ``tokens per text`` steps,
the tokens per text being the answers' own mean once there are a few, ``_PRIOR_TOKENS`` before
(or the most a text may generate, where that is fewer), and the step time doubled
(``_PRIOR_MARGIN``) for what the measured step leaves out (prefill, the host's work, attention
over real contexts).

A request of several texts that would not finish inside its deadline even alone, on an idle
engine, where one text would, is refused as too large (``BatchTooLarge``, a 4xx in each API's
shape) rather than as a wait: retrying it after any Retry-After would be refused again, and
fewer texts a request get through.

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
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TypeVar

from service.contract.errors import (
    BatchTooLarge,
    DeadlineExceeded,
    EngineUnavailable,
    Overloaded,
    ServiceError,
)
from service.frontend.metrics import Children, Metrics

# Time constant of the rate's decaying sums, and the (decayed) answers it needs to be trusted.
_RATE_TAU_S = 5.0
_MIN_ANSWERS = 3.0
# Output tokens a text is taken to need before answers have said (a paragraph's translation).
_PRIOR_TOKENS = 128.0
# The engine's measured decode step, times this, for a step of real work (see above).
_PRIOR_MARGIN = 2.0
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
        self._processes = processes
        # Before answers say how long texts are, a text is taken to need _PRIOR_TOKENS, never
        # more than it may generate: a service capped at 8 tokens a text does not wait for 128.
        self._prior_tokens = min(_PRIOR_TOKENS, float(most_tokens or _PRIOR_TOKENS))
        self._max = max(1, max_in_flight // processes)
        self._metrics = metrics
        self._availability = availability
        self._clock = clock
        self._in_flight = 0
        self._arriving = 0
        self._closed = False
        self._capacity = 1
        self._engine_capacity = 1
        # The engine's decode step seconds by batch size, sorted by batch size.
        self._step_seconds: tuple[tuple[int, float], ...] = ()
        # Decaying sums of answers, of busy seconds and of the in-flight count at each answer,
        # as of ``_updated``.
        self._answers = 0.0
        self._busy_s = 0.0
        self._answered_at = 0.0
        # Decaying sums of the completion tokens of answered texts, and of those answers.
        self._tokens = 0.0
        self._tokened = 0.0
        # When the engine last went from idle to busy (None: idle now).
        self._busy_since: float | None = None
        self._updated = clock()
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
        self._engine_capacity = max(1, capacity)
        self._capacity = max(1, capacity // self._processes)
        self._step_seconds = tuple(
            sorted((b, t) for b, t in (step_seconds or {}).items() if b > 0 and t > 0)
        )

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
                if texts > 1 and self._too_large(texts, now, _DEADLINE_SHARE * (deadline - now)):
                    # Waiting would not help: an idle engine would not finish it in time
                    # either, and a 429 would send the client back with the same request.
                    alone = self._expected_finish_s(texts, now) or 0.0
                    raise BatchTooLarge(
                        f"{texts} texts would take about {alone:.1f} s even on an idle "
                        "service, more than this request's deadline allows; send fewer "
                        "texts per request"
                    )
                raise Overloaded(
                    f"the backlog would take about {expected:.1f} s, more than this "
                    f"request's deadline allows",
                    retry_after_s=self.retry_after_s(),
                )
        self._enter(texts, now)
        return Reservation(self, texts)

    def _too_large(self, texts: int, now: float, allowed_s: float) -> bool:
        """Whether ``texts`` texts would outlast ``allowed_s`` on an idle engine while one text
        would not: a request that fewer texts a request would get through. Past the free rows
        only on a measured rate: the prior's margin is for admitting, and work that may wait
        (a document's slices) keeps waiting on it until answers say how fast the engine is."""
        if texts > self._capacity and self._measured_rate() is None:
            return False
        alone = self._expected_finish_s(texts, now)
        one = self._expected_finish_s(1, now)
        return alone is not None and alone > allowed_s and (one is None or one <= allowed_s)

    def completed(self, tokens: int | None = None) -> None:
        """One text was answered by the engine (whatever the outcome); ``tokens``: the tokens
        it generated, where it has a result."""
        self._advance(self._clock())
        self._answers += 1
        self._answered_at += self._in_flight
        if tokens is not None:
            self._tokens += tokens
            self._tokened += 1

    def drain_rate(self) -> float | None:
        """Texts answered per second of busy time (measured, or the engine's prior), or None
        before either is known."""
        self._advance(self._clock())
        measured = self._measured_rate()
        return measured if measured is not None else self._prior_rate()

    def _measured_rate(self) -> float | None:
        """Answers per busy second, from ``_MIN_ANSWERS`` answers on, once the engine has been
        busy for longer than a generation at a full batch (where its step time is known)."""
        if self._answers < _MIN_ANSWERS or self._busy_s <= 0:
            return None
        # The longer of the prior and the answers' mean: the first answers are the short ones.
        generation = self._generation_s(at_least_prior=True)
        busy_for = 0.0 if self._busy_since is None else self._clock() - self._busy_since
        if generation is not None and busy_for < generation:
            return None
        return self._answers / self._busy_s

    def _prior_rate(self) -> float | None:
        """This process's share of what a full engine answers per second, from its own step
        time; None where the engine measured none."""
        generation = self._generation_s()
        if generation is None:
            return None
        return self._engine_capacity / generation / self._processes

    def _generation_s(self, batch: int | None = None, at_least_prior: bool = False) -> float | None:
        """Seconds one text's generation takes at a batch of ``batch`` texts (a full one where
        None), with ``_PRIOR_MARGIN``, for the answers' mean tokens per text (``at_least_prior``:
        no fewer than the prior's)."""
        if not self._step_seconds:
            return None
        wanted = self._engine_capacity if batch is None else batch
        # The step of the smallest measured batch that holds it, or the largest.
        step = next((t for b, t in self._step_seconds if b >= wanted), self._step_seconds[-1][1])
        prior = self._prior_tokens
        tokens = self._tokens / self._tokened if self._tokened >= _MIN_ANSWERS else prior
        if at_least_prior:
            tokens = max(tokens, prior)
        return _PRIOR_MARGIN * step * max(1.0, tokens)

    def retry_after_s(self) -> float:
        """Seconds until the current backlog has likely drained: at least 1, at most 60."""
        rate = self.drain_rate()
        if not self._in_flight or rate is None:
            return 1.0
        return float(min(60, max(1, math.ceil(self._in_flight / rate))))

    def _expected_finish_s(self, position: int, now: float) -> float | None:
        if position <= self._capacity:
            # A free decode row for every text: it starts now, and is answered after one
            # generation at the batch it joins (this process's share, times the processes).
            # On a fast engine that is far inside any deadline; on a slow one (float32, or
            # slow kernels) a full batch outlasts it, and the texts admitted past what
            # finishes in time would end as 504s.
            return self._generation_s(min(position * self._processes, self._engine_capacity))
        self._advance(now)
        rate = self._measured_rate()
        if rate is None:
            prior = self._prior_rate()
            return None if prior is None else position / prior
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
        self._tokens *= decay
        self._tokened *= decay
        self._updated = now

    def _enter(self, texts: int, now: float) -> None:
        self._advance(now)
        if not self._in_flight:
            self._busy_since = now
        self._in_flight += texts
        self._idle.clear()
        self._metrics.in_flight.set(self._in_flight)
        self.count_refusals()

    def _leave(self, texts: int) -> None:
        self._advance(self._clock())
        self._in_flight -= texts
        if not self._in_flight:
            self._busy_since = None
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
