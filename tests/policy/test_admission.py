"""Admission's decisions, on a clock the test moves: bound, deadline estimate, Retry-After."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.contract.errors import (
    BatchTooLarge,
    DeadlineExceeded,
    EngineUnavailable,
    Overloaded,
    ServiceError,
)
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission(clock: Clock, bound: int = 100, capacity: int = 8) -> Admission:
    def available() -> ServiceError | None:
        return None

    made = Admission(bound, Metrics(), available, clock=clock)
    made.set_engine(capacity)
    return made


def serve_one_at_a_time(gate: Admission, clock: Clock, count: int, seconds: float) -> None:
    """``count`` lone requests, each answered after ``seconds``."""
    for _ in range(count):
        with gate.reserve(1, None):
            clock.now += seconds
            gate.completed()


def test_the_bound_refuses_with_retry_after() -> None:
    clock = Clock()
    gate = admission(clock, bound=3)
    held = gate.reserve(3, None)
    with pytest.raises(Overloaded) as refused:
        gate.reserve(1, None)
    assert refused.value.retry_after_s >= 1
    assert gate.full
    held.release(3)
    gate.reserve(1, None).release()


def test_a_burst_after_lone_requests_is_admitted_at_the_engines_latency() -> None:
    clock = Clock()
    gate = admission(clock, capacity=8)
    serve_one_at_a_time(gate, clock, 5, seconds=1.0)  # rate 1 text/s at one in flight
    clock.now += 30  # quiet
    # Eight at once batch together: about a second each, not eight.
    burst = [gate.reserve(1, clock.now + 3.0) for _ in range(8)]
    assert gate.in_flight == 8
    for reservation in burst:
        reservation.release()


def test_a_burst_is_not_refused_for_the_load_it_brings_itself() -> None:
    # Seen on the H200: 1,024 requests arriving within 0.3 s after lone requests, with room for
    # all of them in one batch, got 215 refusals: the burst's own in-flight count was taken for
    # the load the (lone requests') rate had been measured at.
    clock = Clock()
    gate = admission(clock, bound=4096, capacity=1024)
    serve_one_at_a_time(gate, clock, 8, seconds=1.0)
    clock.now += 1.0
    burst = []
    for _ in range(1024):
        burst.append(gate.reserve(1, clock.now + 100.0))
        clock.now += 0.0003
    assert gate.in_flight == 1024
    for reservation in burst:
        reservation.release()


def test_under_saturation_a_request_that_cannot_finish_in_time_is_refused() -> None:
    clock = Clock()
    gate = admission(clock, capacity=4)
    held = [gate.reserve(1, None) for _ in range(40)]
    for _ in range(40):  # 40 in flight, 4 answered per second, for 10 s
        clock.now += 0.25
        gate.completed()
    rate = gate.drain_rate()
    assert rate is not None
    assert 3.5 < rate < 4.5
    # 41st in line: about 10 s; a 20 s deadline allows it, a 5 s one does not.
    gate.reserve(1, clock.now + 20.0).release()
    with pytest.raises(Overloaded) as refused:
        gate.reserve(1, clock.now + 5.0)
    assert 9 <= refused.value.retry_after_s <= 11
    for reservation in held:
        reservation.release()


def test_a_deadline_already_past_and_a_closed_gate_are_refused() -> None:
    clock = Clock()
    gate = admission(clock)
    with pytest.raises(DeadlineExceeded):
        gate.reserve(1, clock.now - 1)
    gate.close()
    with pytest.raises(EngineUnavailable):
        gate.reserve(1, None)


def test_each_of_several_api_processes_admits_its_share_of_the_bound() -> None:
    made = Admission(10, Metrics(), lambda: None, processes=4)
    made.set_engine(8)
    held = [made.reserve(1, None) for _ in range(2)]
    assert made.full  # 10 // 4
    with pytest.raises(Overloaded):
        made.reserve(1, None)
    held[0].release()
    assert not made.full


def test_requests_on_their_way_close_the_door_until_they_arrive() -> None:
    gate = admission(Clock(), bound=3)
    first = gate.arrive()
    gate.arrive()
    assert not gate.full
    gate.reserve(1, None)
    assert gate.full  # one admitted, two on their way: the bound of 3 is taken
    first()
    first()  # once only
    assert not gate.full


def profiled(clock: Clock, bound: int, capacity: int, step_s: float) -> Admission:
    """Admission in front of an engine that measured its full batch's decode step at start."""
    made = Admission(bound, Metrics(), lambda: None, clock=clock)
    made.set_engine(capacity, {1: step_s / 10, capacity: step_s})
    return made


def test_a_burst_s_first_answers_are_not_taken_for_its_throughput() -> None:
    # Issue 36: 1,024 texts into an idle engine, three answered after 2 s: a rate of 1.5 texts/s
    # taken from those refused everything for minutes while the engine had room.
    clock = Clock()
    gate = profiled(clock, bound=4096, capacity=256, step_s=0.02)
    burst = [gate.reserve(1, clock.now + 100.0) for _ in range(1000)]
    clock.now += 2.0
    for reservation in burst[:3]:
        gate.completed(tokens=20)
        reservation.release()
    # 998 in flight, 256 rows generating: a new text waits for about three waves of short ones.
    late = gate.reserve(1, clock.now + 30.0)
    assert gate.in_flight == 998
    late.release()
    for reservation in burst[3:]:
        reservation.release()


def test_a_burst_into_an_engine_that_answered_nothing_is_cut_at_what_fits() -> None:
    # Issue 36's mirror case: with no answer yet there was no rate, everything was admitted,
    # and what could not finish in time ended as 504s after its deadline.
    clock = Clock()
    gate = profiled(clock, bound=4096, capacity=256, step_s=0.05)
    # A full batch: 256 texts per 2 x 0.05 s x 128 tokens = 12.8 s, 20 texts/s; 60% of a 30 s
    # deadline holds 360 texts.
    admitted, refused = [], []
    for _ in range(1000):
        try:
            admitted.append(gate.reserve(1, clock.now + 30.0))
        except Overloaded as error:
            refused.append(error)
    assert len(admitted) == 360
    assert len(refused) == 640
    assert refused[0].retry_after_s == 18  # the 360 admitted drain in about 18 s
    for reservation in admitted:
        reservation.release()


def test_the_prior_never_assumes_more_tokens_than_a_text_may_generate() -> None:
    # The same burst into a service whose texts generate 8 tokens at most (HYMT_MAX_NEW_TOKENS):
    # a full batch answers 256 texts per 2 x 0.05 s x 8 tokens, and all 1,000 fit in 60% of
    # 30 s, where the prior's 128 tokens a text would have cut them at 360.
    clock = Clock()
    gate = Admission(4096, Metrics(), lambda: None, clock=clock, most_tokens=8)
    gate.set_engine(256, {1: 0.005, 256: 0.05})
    admitted = [gate.reserve(1, clock.now + 30.0) for _ in range(1000)]
    assert gate.in_flight == 1000
    assert gate.drain_rate() == pytest.approx(256 / 0.8)
    for reservation in admitted:
        reservation.release()
    # A cap above the prior's 128 leaves the prior as it was.
    wide = Admission(4096, Metrics(), lambda: None, clock=clock, most_tokens=4096)
    wide.set_engine(256, {1: 0.005, 256: 0.05})
    assert wide.drain_rate() == pytest.approx(256 / 12.8)


def test_while_a_decode_row_is_free_the_deadline_estimate_refuses_nothing() -> None:
    clock = Clock()
    gate = admission(clock, capacity=8)
    serve_one_at_a_time(gate, clock, 5, seconds=1.0)  # one text a second, alone
    held = [gate.reserve(1, None) for _ in range(7)]
    # The eighth row is free: admitted with any deadline the estimate would have refused.
    gate.reserve(1, clock.now + 1.0).release()
    with pytest.raises(Overloaded):
        gate.reserve(2, clock.now + 1.0)  # past the rows: the estimate applies
    for reservation in held:
        reservation.release()


def test_the_measured_rate_takes_over_once_the_engine_was_busy_for_a_generation() -> None:
    clock = Clock()
    gate = profiled(clock, bound=4096, capacity=4, step_s=0.01)  # prior: 2.56 s a generation
    held = [gate.reserve(1, None) for _ in range(40)]
    for _ in range(40):  # 4 answers a second for 10 s
        clock.now += 0.25
        gate.completed(tokens=128)
    rate = gate.drain_rate()
    assert rate is not None
    assert 3.5 < rate < 4.5  # measured, not the prior's 4 / 2.56 s
    for reservation in held:
        reservation.release()


# Run 70's 4-bit engine in 16 GiB (H100): 256 rows, decode step ms by batch size at start.
SLOW_STEPS_MS = {1: 11.161, 2: 109.846, 4: 107.948, 8: 109.277, 16: 113.152, 24: 133.465,
                 32: 139.973, 48: 287.016, 64: 303.986, 96: 433.876, 128: 447.646,
                 192: 569.657, 256: 574.29}  # fmt: skip


def test_a_slow_engine_s_free_rows_are_filled_only_as_far_as_a_generation_fits() -> None:
    # Run 70: 1,024 at once into that engine behind 8 API processes, 100 s deadline: every
    # text with a free row was admitted, and 104 of the 256 ended as 504s (a full batch
    # generates for 2 x 0.574 s x 128 tokens); each process now stops at 4 (32 rows: 36 s).
    clock = Clock()
    gate = Admission(4096, Metrics(), lambda: None, clock=clock, processes=8)
    gate.set_engine(256, {b: ms / 1000 for b, ms in SLOW_STEPS_MS.items()})
    admitted, refused = [], []
    for _ in range(128):
        try:
            admitted.append(gate.reserve(1, clock.now + 100.0))
        except Overloaded as error:
            refused.append(error)
    assert (len(admitted), len(refused)) == (4, 124)
    for reservation in admitted:
        reservation.release()


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(0.001, 2.0), min_size=1, max_size=8).map(sorted),
    capacity_log=st.integers(0, 10),
    processes=st.sampled_from([1, 2, 8]),
    deadline_s=st.floats(1.0, 300.0),
)
def test_free_rows_are_refused_only_where_a_generation_would_outlast_the_deadline(
    steps: list[float], capacity_log: int, processes: int, deadline_s: float
) -> None:
    # The decode step measured at start, by batch size (slower as the batch grows).
    capacity = 2**capacity_log
    buckets = sorted({max(1, capacity * (i + 1) // len(steps)) for i in range(len(steps))})
    profile = dict(zip(buckets, steps[-len(buckets) :], strict=True))
    clock = Clock()
    gate = Admission(1 << 20, Metrics(), lambda: None, clock=clock, processes=processes)
    gate.set_engine(capacity, profile)
    share = capacity // processes or 1
    held = []
    for position in range(1, share + 1):
        batch = min(position * processes, capacity)
        step = next(t for b, t in sorted(profile.items()) if b >= batch)
        fits = 2.0 * step * 128 <= 0.6 * deadline_s
        try:
            held.append(gate.reserve(1, clock.now + deadline_s))
        except Overloaded:
            assert not fits, "refused a free row on an engine that finishes it in time"
            break
        assert fits, "admitted a text that a full enough batch cannot finish in time"
    for reservation in held:
        reservation.release()


def test_the_doors_refusal_is_kept_while_it_would_say_the_same_and_each_is_counted() -> None:
    clock = Clock()
    metrics = Metrics()
    gate = Admission(3, metrics, lambda: None, clock=clock)
    gate.set_engine(8)
    held = gate.reserve(3, None)
    first = gate.refusal()
    clock.now += 0.05
    assert gate.refusal() is first  # a flood's refusals: worked out once
    clock.now += 0.1
    later = gate.refusal()
    assert later is not first  # Retry-After is worked out again after a while
    assert later.message == first.message
    held.release(1)
    assert gate.refusal().message == "2 texts in flight, at most 3"  # never stale in flight
    held.release(2)
    exposition = metrics.render().decode()
    assert 'hymt_queue_rejections_total{reason="queue_full"} 4.0' in exposition


def test_a_refusal_for_a_full_queue_is_counted_after_it_at_the_next_change_or_rendering() -> None:
    # A flood's refusals are over in milliseconds; each one's count (a lock, and with several
    # processes a write into their shared file) was made between them.
    metrics = Metrics()
    gate = Admission(1, metrics, lambda: None)
    gate.set_engine(8)
    held = gate.reserve(1, None)
    series = 'hymt_queue_rejections_total{reason="queue_full"}'

    def counted() -> float | None:  # read from the registry, which renders nothing
        return metrics.registry.get_sample_value(
            "hymt_queue_rejections_total", {"reason": "queue_full"}
        )

    for _ in range(3):
        gate.refusal()
    assert not counted()  # not yet: nothing counted between the refusals
    assert f"{series} 3.0" in metrics.render().decode()  # a rendering counts them
    gate.refusal()
    held.release()  # a change of the texts in flight counts them too
    assert counted() == 4


@settings(max_examples=200, deadline=None)
@given(
    texts=st.integers(1, 400),
    held=st.integers(0, 200),
    one_ms=st.sampled_from([1.0, 10.0, 100.0]),
    full_ms=st.sampled_from([1.0, 10.0, 100.0, 1000.0]),
    deadline_s=st.floats(1.0, 120.0),
)
@example(texts=1, held=0, one_ms=10.0, full_ms=1.0, deadline_s=1.0)  # a one-row step read down
def test_a_request_that_fewer_texts_would_get_through_is_refused_as_too_large(
    texts: int, held: int, one_ms: float, full_ms: float, deadline_s: float
) -> None:
    # Where a request's texts, alone on an idle engine, would outlast its deadline and one
    # text would not, it is refused as too large (a 4xx: waiting and retrying would get the
    # same refusal); where even one text would not, it stays a 429; what finishes in time is
    # admitted. The engine's prior only (no answers yet): a generation is 2 x step x 128
    # tokens at the batch's step; past the 64 rows, a full batch a generation, and there the
    # prior never calls a request too large (its margin is for admitting).
    capacity = 64
    clock = Clock()
    gate = Admission(1 << 20, Metrics(), lambda: None, clock=clock)
    gate.set_engine(capacity, {1: one_ms / 1000, capacity: full_ms / 1000})
    backlog = gate.reserve(held, None) if held else None

    def finish_s(position: int) -> float:
        # A step of one row read as no dearer than the full batch's (``no_dearer_than_wider``).
        one = min(one_ms, full_ms)
        generation = 2.0 * 128 * (one if position <= 1 else full_ms) / 1000
        if position <= capacity:
            return generation
        return position / (capacity / (2.0 * 128 * full_ms / 1000))

    allowed = 0.6 * deadline_s
    try:
        reservation = gate.reserve(texts, clock.now + deadline_s)
    except BatchTooLarge:
        assert finish_s(held + texts) > allowed
        assert 1 < texts <= capacity
        assert finish_s(texts) > allowed >= finish_s(1)
    except Overloaded:
        assert finish_s(held + texts) > allowed
        assert texts == 1 or texts > capacity or not finish_s(texts) > allowed >= finish_s(1)
    else:
        assert finish_s(held + texts) <= allowed * (1 + 1e-9)
        reservation.release(texts)
    if backlog is not None:
        backlog.release(held)


def test_a_request_too_large_for_the_measured_rate_is_refused_as_too_large() -> None:
    # Found by a probe: 2,000 texts in one Google v2 request to the CPU demo were refused by an
    # idle service with a 429 and a Retry-After ("the backlog would take about 60.4 s"), so a
    # client that waits and retries is refused for ever. On the measured rate, a request that
    # fewer texts would get through is refused as too large; one that fits is admitted.
    clock = Clock()
    gate = admission(clock, bound=4096, capacity=8)
    serve_one_at_a_time(gate, clock, 20, seconds=0.5)  # measured: 2 texts a busy second
    clock.now += 5.0
    with pytest.raises(BatchTooLarge, match="200 texts would take about"):
        gate.reserve(200, clock.now + 30.0)
    # One long text's segments: the client can only send it in shorter parts.
    with pytest.raises(BatchTooLarge, match=r"200 segments .* send the text in shorter parts"):
        gate.reserve(200, clock.now + 30.0, segments=True)
    assert gate.in_flight == 0
    gate.reserve(40, clock.now + 30.0).release(40)
