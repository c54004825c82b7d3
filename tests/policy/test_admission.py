"""Admission's decisions, on a clock the test moves: bound, deadline estimate, Retry-After."""

from __future__ import annotations

import pytest

from service.contract.errors import DeadlineExceeded, EngineUnavailable, Overloaded, ServiceError
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
