"""The engine's step times as admission reads them (``policy.drain``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission
from service.frontend.policy.drain import no_dearer_than_wider

_times = st.dictionaries(
    st.integers(1, 4096), st.floats(1e-6, 10.0, allow_nan=False), min_size=1, max_size=16
)


@given(times=_times)
@settings(max_examples=200, deadline=None)
def test_no_batch_is_read_dearer_than_a_wider_one(times: dict[int, float]) -> None:
    kept = no_dearer_than_wider(times)
    assert list(kept) == sorted(times)
    for batch, seconds in kept.items():
        # Never raised; the least of its own and every wider batch's time.
        assert seconds <= times[batch]
        assert seconds == min(t for b, t in times.items() if b >= batch)
    ordered = [kept[b] for b in sorted(kept)]
    assert ordered == sorted(ordered)


@given(times=_times)
@settings(max_examples=50, deadline=None)
def test_times_already_in_order_are_read_as_they_are(times: dict[int, float]) -> None:
    ordered = dict(zip(sorted(times), sorted(times.values()), strict=True))
    assert no_dearer_than_wider(ordered) == ordered


def test_a_narrow_step_timed_once_on_a_busy_host_does_not_refuse_a_free_row() -> None:
    # Seen in make test: the engine's start timed a 2-row step once (a run over 50 ms is not
    # repeated) at 202.871 ms beside 13.472 at one row and about 15 at four, on the busy 2-core
    # machine; admission's prior from it (a generation of 2 x 0.202871 x 128 = 51.9 s) refused
    # the second text of an idle service with a 60 s deadline. Read as no dearer than the 4-row
    # step, both are admitted.
    now = [1000.0]
    gate = Admission(64, Metrics(), lambda: None, clock=lambda: now[0])
    gate.set_engine(4, {1: 0.013472, 2: 0.202871, 4: 0.0151})
    first = gate.reserve(1, now[0] + 60.0)
    second = gate.reserve(1, now[0] + 60.0)
    assert gate.in_flight == 2
    first.release()
    second.release()
