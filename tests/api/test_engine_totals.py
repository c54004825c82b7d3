"""The engine's running totals (its step loop's seconds by part, its device's seconds) become
Prometheus counters that only grow: across reads of a part that lag a step, and across engine
restarts, whose totals start again from zero."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.contract.protocol import Stats
from service.frontend.metrics import Metrics

# One report of an engine: how much its totals grew since the one before, and whether the
# part's read lagged (the engine reads its parts without a lock: a value below the last).
_report = st.tuples(st.floats(0, 50, allow_nan=False), st.booleans())


def _stats(steps: int, wait: float | None) -> Stats:
    return Stats(
        in_flight=0,
        running=0,
        answered=0,
        generated_tokens=0,
        memory={},
        steps=steps,
        device_seconds=wait,
        loop_seconds={} if wait is None else {"wait": wait},
    )


@given(st.lists(st.lists(_report, min_size=1, max_size=8), min_size=1, max_size=4))
def test_the_counters_add_up_every_engine_s_totals(engines: list[list[tuple[float, bool]]]) -> None:
    metrics = Metrics()
    expected = 0.0
    for reports in engines:  # each a new engine process, reporting from before it loaded
        metrics.record_engine(_stats(0, None))
        total = highest = 0.0
        for steps, (grown, lagging) in enumerate(reports, start=1):
            total += grown
            read = total / 2 if lagging else total
            metrics.record_engine(_stats(steps, read))
            highest = max(highest, read)
        expected += highest
    for name, labels in (
        ("hymt_engine_loop_seconds_total", {"part": "wait"}),
        ("hymt_engine_device_seconds_total", {}),
    ):
        counted = metrics.registry.get_sample_value(name, labels) or 0.0
        assert abs(counted - expected) <= 1e-6 * max(1.0, expected)
