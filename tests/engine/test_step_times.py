"""The decode step times the engine measures at start, which admission's prior rests on."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast import runner
from service.engine.fast.runner import ModelRunner, no_dearer_than_wider

_times = st.dictionaries(
    st.integers(1, 4096), st.floats(1e-6, 10.0, allow_nan=False), min_size=1, max_size=16
)


@given(times=_times)
@settings(max_examples=200, deadline=None)
def test_no_bucket_is_dearer_than_a_wider_one(times: dict[int, float]) -> None:
    kept = no_dearer_than_wider(times)
    assert list(kept) == sorted(times)
    for bucket, seconds in kept.items():
        # Never raised, never under what a wider step measured, none above a wider one's.
        assert seconds <= times[bucket]
        assert seconds == min(t for b, t in times.items() if b >= bucket)
    ordered = [kept[b] for b in sorted(kept)]
    assert ordered == sorted(ordered)


@given(times=_times)
@settings(max_examples=50, deadline=None)
def test_times_already_in_order_are_kept(times: dict[int, float]) -> None:
    ordered = dict(zip(sorted(times), sorted(times.values()), strict=True))
    assert no_dearer_than_wider(ordered) == ordered


def test_a_narrow_step_timed_once_on_a_busy_host_takes_the_wider_step_s_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The make-test failure: a 2-row step's only run (over _RETIME_BELOW_S, so not repeated)
    # met a busy host at 202.871 ms beside 13.472 at one row; admission's prior from it
    # refused work a fresh service had room for. A fake clock: each run costs what the table
    # says, the 2-row step's first 0.2029 s.
    clock = [0.0]
    costs = {1: [0.013472], 2: [0.202871, 0.014], 4: [0.0151, 0.0150, 0.0150]}
    runs: list[int] = []

    def step(bucket: int, full: bool, context: int) -> None:
        runs.append(bucket)
        left = costs[bucket]
        clock[0] += left.pop(0) if len(left) > 1 else left[0]

    fake = types.SimpleNamespace(
        _buckets=[1, 2, 4], _synchronize=lambda: None, _step=step, device=torch.device("cpu")
    )
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    times = ModelRunner.time_steps(fake)  # type: ignore[arg-type]
    assert runs.count(2) == 1, "a step over _RETIME_BELOW_S is not run again"
    assert times == pytest.approx({1: 0.013472, 2: 0.015, 4: 0.015})
