"""How fast the engine answers one API process's texts, for admission (``admission.py``).

The rate is texts answered per second *of busy time* (time with anything in flight): idle time is
left out, so a lightly loaded engine is not mistaken for a slow one, and under saturation it is
the engine's throughput. It is a ratio of two exponentially decaying sums (answers, busy seconds)
with the same time constant, updated in O(1) at every admission, answer and release.

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

With several API processes in front of one engine each process counts its share: the capacity
is divided by the number of processes, and the rate and the load it was measured at are each
process's own, so their ratio stays the engine's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

# Time constant of the rate's decaying sums, and the (decayed) answers it needs to be trusted.
_RATE_TAU_S = 5.0
_MIN_ANSWERS = 3.0
# Output tokens a text is taken to need before answers have said (a paragraph's translation).
_PRIOR_TOKENS = 128.0
# The engine's measured decode step, times this, for a step of real work (see above).
_PRIOR_MARGIN = 2.0


class DrainEstimate:
    """The engine's drain rate as one API process sees it, and when a text admitted at a given
    place in this process's queue would be answered."""

    def __init__(
        self, clock: Callable[[], float], processes: int = 1, most_tokens: int | None = None
    ) -> None:
        """``processes``: API processes sharing the engine; ``most_tokens``: the most a text
        may generate (the service's ``max_new_tokens``)."""
        self._clock = clock
        self._processes = processes
        # Before answers say how long texts are, a text is taken to need _PRIOR_TOKENS, never
        # more than it may generate: a service capped at 8 tokens a text does not wait for 128.
        self._prior_tokens = min(_PRIOR_TOKENS, float(most_tokens or _PRIOR_TOKENS))
        self.capacity = 1  # this process's share of the engine's decode rows
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

    def set_engine(self, capacity: int, step_seconds: Mapping[int, float] | None = None) -> None:
        """Texts the engine generates at once, and the seconds of its decode step by batch size
        (from its ``Ready``; none where it did not measure them)."""
        self._engine_capacity = max(1, capacity)
        self.capacity = max(1, capacity // self._processes)
        measured = {b: t for b, t in (step_seconds or {}).items() if b > 0 and t > 0}
        self._step_seconds = tuple(sorted(no_dearer_than_wider(measured).items()))

    def busy(self, now: float) -> None:
        """Texts went in flight with none before (after ``advance``)."""
        self._busy_since = now

    def idle(self) -> None:
        """The last text in flight left (after ``advance``)."""
        self._busy_since = None

    def advance(self, now: float) -> None:
        """Decay the sums to ``now``, counting the busy time since the last update."""
        elapsed = now - self._updated
        if elapsed <= 0:
            return
        decay = math.exp(-elapsed / _RATE_TAU_S)
        self._answers *= decay
        # Busy seconds in (updated, now], decayed as if spread evenly over it.
        busy = _RATE_TAU_S * (1 - decay) if self._busy_since is not None else 0.0
        self._busy_s = self._busy_s * decay + busy
        self._answered_at *= decay
        self._tokens *= decay
        self._tokened *= decay
        self._updated = now

    def answered(self, in_flight: int, tokens: int | None) -> None:
        """One text was answered with ``in_flight`` texts in flight; ``tokens``: what it
        generated, where it has a result."""
        self.advance(self._clock())
        self._answers += 1
        self._answered_at += in_flight
        if tokens is not None:
            self._tokens += tokens
            self._tokened += 1

    def rate(self) -> float | None:
        """Texts answered per second of busy time (measured, or the engine's prior), or None
        before either is known."""
        self.advance(self._clock())
        measured = self._measured_rate()
        return measured if measured is not None else self._prior_rate()

    def finish_s(self, position: int, now: float) -> float | None:
        """Seconds until a text admitted at ``position`` in this process's queue is answered;
        None where nothing is known yet."""
        if position <= self.capacity:
            # A free decode row for every text: it starts now, and is answered after one
            # generation at the batch it joins (this process's share, times the processes).
            # On a fast engine that is far inside any deadline; on a slow one (float32, or
            # slow kernels) a full batch outlasts it, and the texts admitted past what
            # finishes in time would end as 504s.
            return self._generation_s(min(position * self._processes, self._engine_capacity))
        self.advance(now)
        rate = self._measured_rate()
        if rate is None:
            prior = self._prior_rate()
            return None if prior is None else position / prior
        measured_at = self._answered_at / self._answers  # in flight, on average, at an answer
        batched = min(position, self.capacity)
        # Halved: near saturation more in flight no longer buys proportionally more throughput,
        # and an estimate that is too kind turns into 504s.
        return position / (rate * max(1.0, batched / (2 * max(measured_at, 1.0))))

    def too_large(self, texts: int, now: float, allowed_s: float) -> float | None:
        """The seconds ``texts`` texts would take on an idle engine where that outlasts
        ``allowed_s`` while one text would not (a request that fewer texts a request would get
        through); else None. Past the free rows only on a measured rate: the prior's margin is
        for admitting, and work that may wait (a document's slices) keeps waiting on it until
        answers say how fast the engine is."""
        if texts > self.capacity and self._measured_rate() is None:
            return None
        alone = self.finish_s(texts, now)
        one = self.finish_s(1, now)
        if alone is None or alone <= allowed_s or (one is not None and one > allowed_s):
            return None
        return alone

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


def no_dearer_than_wider(times: Mapping[int, float]) -> dict[int, float]:
    """``times`` (seconds a decode step, by batch size) with each at most the least of every
    wider batch's. The engine times each step once where a run is dear (on a busy host a narrow
    step's one sample can meet a cost not its own), and a prior that made a narrow batch dearer
    than a wide one would refuse the first texts of a fresh service for want of a row it has;
    read so, a narrow step is never expected to outlast a wider one."""
    kept: dict[int, float] = {}
    least = float("inf")
    for batch in sorted(times, reverse=True):
        least = min(least, times[batch])
        kept[batch] = least
    return {batch: kept[batch] for batch in sorted(kept)}
