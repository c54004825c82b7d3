"""How a throughput run used the engine over time: the texts generating at once, sampled.

The engine alone (``loadtests.profile``) and through HTTP (``loadtests.bench``) do the same work;
where their durations differ, the samples say whether it was at the start (the batch filled
later: ``ramp_s``) or at the end (a longer tail of a few texts: ``tail_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Timeline:
    samples: int
    peak_running: int
    # From the start until the first sample with at least 90% of the peak generating.
    ramp_s: float
    # From the last sample with at least half the peak generating until the end.
    tail_s: float
    # Texts generating on average between the ramp and the tail: how full the rows were while
    # loaded (a closed loop keeps as many in flight, but those in HTTP, preparation or their
    # prefill hold no decode row).
    loaded_mean_running: float
    # The accelerator's mean busy share over the same span (the engine's
    # ``hymt_engine_device_busy_ratio``), None where it was not sampled: under 1 while the rows
    # are full, the device waited for the host.
    loaded_device_busy: float | None = None
    # The same span's share of the wall time in each of the engine's running totals where it
    # reports them (``hymt_engine_loop_seconds_total`` by part, and ``device``: its
    # ``hymt_engine_device_seconds_total``), from the first and the last sample inside it.
    loaded_shares: dict[str, float] = field(default_factory=dict)


def summarize(
    samples: Sequence[tuple[float, int]],
    duration_s: float,
    busy: Sequence[tuple[float, float]] = (),
    totals: Sequence[tuple[float, dict[str, float]]] = (),
) -> Timeline:
    """``samples``: (seconds since the start, texts generating) pairs, in order; ``busy``:
    (seconds since the start, the device's busy share) pairs; ``totals``: (seconds since the
    start, the engine's running totals by name) pairs, in order."""
    peak = max((running for _, running in samples), default=0)
    ramp = next((t for t, running in samples if running >= 0.9 * peak), 0.0)
    last_half = max((t for t, running in samples if running >= 0.5 * peak), default=0.0)
    loaded = [running for t, running in samples if ramp <= t <= last_half]
    shares = [share for t, share in busy if ramp <= t <= last_half]
    return Timeline(
        samples=len(samples),
        peak_running=peak,
        ramp_s=round(ramp, 3),
        tail_s=round(max(0.0, duration_s - last_half), 3),
        loaded_mean_running=round(sum(loaded) / len(loaded), 1) if loaded else 0.0,
        loaded_device_busy=round(sum(shares) / len(shares), 3) if shares else None,
        loaded_shares=_shares([(t, kept) for t, kept in totals if ramp <= t <= last_half]),
    )


def _shares(totals: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """What each running total gained between the first and the last of ``totals``, as a share
    of the seconds between them."""
    if len(totals) < 2 or totals[-1][0] <= totals[0][0]:
        return {}
    (began, first), (ended, last) = totals[0], totals[-1]
    return {name: round((last[name] - first.get(name, 0.0)) / (ended - began), 3) for name in last}
