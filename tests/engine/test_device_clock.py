"""The device clock adds each span once it has run, by kind and bucket, and never waits."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from service.engine.fast.device_clock import DeviceClock
from service.engine.host import busy_share


class FakeEvent:
    """A CUDA event on a fake stream: recorded at the next tick of a clock, passed once the
    test says the device got there."""

    ticks = itertools.count()
    passed_up_to = -1

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = -1

    def record(self) -> None:
        self.at = next(FakeEvent.ticks)

    def query(self) -> bool:
        return self.at <= FakeEvent.passed_up_to

    def elapsed_time(self, end: FakeEvent) -> float:
        assert end.query(), "read only once passed"
        return float(end.at - self.at)  # one millisecond per tick


def test_spans_are_added_by_kind_and_bucket_once_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.ticks, FakeEvent.passed_up_to = itertools.count(), -1
    clock = DeviceClock(torch.device("cuda"))
    prefill = clock.start()  # tick 0
    clock.stop(prefill)  # 1
    decode = clock.start()  # 2
    clock.stop(decode, 64)  # 3
    again = clock.start()  # 4
    clock.stop(again, 64)  # 5
    clock.settle()
    assert clock.times.prefill_s == clock.times.decode_s == 0.0  # nothing has run yet
    FakeEvent.passed_up_to = 3
    clock.settle()
    assert clock.times.prefill_s == pytest.approx(0.001)
    ((seconds, steps),) = clock.times.decode_by_bucket.values()
    assert seconds == pytest.approx(0.001)
    assert steps == 1
    assert list(clock.times.decode_by_bucket) == [64]
    FakeEvent.passed_up_to = 5
    clock.settle()
    clock.settle()  # each span once
    assert clock.times.decode_s == pytest.approx(0.002)
    assert clock.times.decode_by_bucket[64][0] == pytest.approx(0.002)
    assert clock.times.decode_by_bucket[64][1] == 2


def test_nothing_is_timed_off_a_gpu() -> None:
    clock = DeviceClock(torch.device("cpu"))
    started = clock.start()
    assert started is None
    clock.stop(started, 8)
    clock.settle()
    assert clock.times.decode_by_bucket == {}


@given(
    device=st.tuples(st.floats(0, 1e6), st.floats(0, 10)),
    clock=st.tuples(st.floats(0, 1e6), st.floats(1e-3, 10)),
)
def test_the_busy_share_is_the_device_s_seconds_over_the_wall_s(
    device: tuple[float, float], clock: tuple[float, float]
) -> None:
    (before, worked), (then, elapsed) = device, clock
    share, _ = busy_share((before, then), before + worked, then + elapsed)
    assert share == pytest.approx(min(1.0, worked / elapsed), abs=1e-3)
    assert busy_share(None, before + worked, then + elapsed)[0] is None  # the first report
    assert busy_share((before, then), None, then + elapsed) == (None, None)  # not timed
    assert busy_share((before, then), before + worked, then)[0] is None  # no time between


@given(
    st.lists(
        st.tuples(st.floats(0.05, 1.0), st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=40
    )
)
def test_work_that_arrives_late_is_carried_not_lost(
    intervals: list[tuple[float, float, float]],
) -> None:
    # Each report interval: its length, the share of it the device worked, and the part of
    # that work whose events the engine reads only by the next report. The shares, weighted by
    # their intervals, add up to the device's seconds as read, less at most what one interval
    # holds (shares over 1 were once cut to 1, and their mean undercounted a busy device:
    # docs/benchmarks.md, run 102).
    now, done, late = 0.0, 0.0, 0.0
    _, at = busy_share(None, 0.0, now)
    credited = 0.0
    for length, busy, lagged in intervals:
        now += length
        work = busy * length
        done += late + work * (1 - lagged)
        late = work * lagged
        share, at = busy_share(at, done, now)
        assert share is not None
        assert 0.0 <= share <= 1.0
        credited += share * length
    assert done - 1.0 - 1e-3 * now <= credited <= done + 1e-3 * now
