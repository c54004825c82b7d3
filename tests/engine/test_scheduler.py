"""The fast engine's scheduler and step, driven with made-up tokens: no model, no torch.

A fake device stands in for the model runner. It keeps, per decode row, which request the row
holds and how many tokens it has produced, moved exactly as the runner moves its rows (joins,
packing down), and answers each launched step with the token its request would produce at that
index. So a scheduler that put a request in the wrong row, packed rows wrongly, lost a page or
read a step out of order produces wrong texts here, as it would on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract.errors import DeadlineExceeded, InvalidInput, OutOfMemory, ServiceError
from service.engine.fast.pages import PageManager
from service.engine.fast.scheduler import (
    Chunk,
    DecodePlan,
    Finished,
    Joined,
    Retired,
    Scheduler,
)
from service.engine.fast.sequence import RowParameters, Sequence
from service.engine.fast.step import Stepper

EOS = 0
GREEDY = RowParameters(True, 1.0, 1, 1.0, 1.0)


def token_of(request_id: str, index: int, eos_at: dict[str, int]) -> int:
    """The token a request produces at output ``index``: EOS at its ``eos_at`` index."""
    if eos_at.get(request_id) == index:
        return EOS
    return 1 + (sum(map(ord, request_id)) * 7 + index * 13) % 97


@dataclass
class Launched:
    rows: int
    tokens: np.ndarray


@dataclass
class FakeDevice:
    """Rows as the runner keeps them: the request in each row and its next output index."""

    eos_at: dict[str, int]
    rows: list[tuple[str, int] | None] = field(default_factory=lambda: [None] * 64)
    owners: dict[int, tuple[int, int]] = field(default_factory=dict)  # page -> (row, logical)
    prefilled: dict[str, list[int]] = field(default_factory=dict)  # request -> positions done

    def prefill(self, chunks: list[Chunk]) -> list[int]:
        firsts = []
        for chunk in chunks:
            done = self.prefilled.setdefault(chunk.sequence.request_id, [])
            assert len(done) == chunk.start, "chunks of a prompt in order, none skipped"
            assert len(chunk.sequence.pages) * PAGE >= chunk.start + chunk.count
            done.extend(range(chunk.start, chunk.start + chunk.count))
            if chunk.completes:
                firsts.append(token_of(chunk.sequence.request_id, 0, self.eos_at))
        return firsts

    def firsts(self, pending: list[int]) -> list[int]:
        return pending

    def join(self, joined: Joined) -> None:
        self._clear(joined.freed)
        for row, sequence, token in joined.rows:
            assert self.rows[row] is None, "a row joined while another request held it"
            assert token == token_of(sequence.request_id, 0, self.eos_at)
            self.rows[row] = (sequence.request_id, 1)
        self._own(joined.owners.pages, joined.owners.rows, joined.owners.logical)

    def launch(self, plan: DecodePlan) -> Launched:
        self._own(plan.grown.pages, plan.grown.rows, plan.grown.logical)
        tokens = np.zeros(plan.rows, dtype=np.int64)
        for row in range(plan.rows):
            held = self.rows[row]
            assert held is not None, f"decode over row {row}, which holds nothing"
            request_id, index = held
            tokens[row] = token_of(request_id, index, self.eos_at)
            self.rows[row] = (request_id, index + 1)
        return Launched(plan.rows, tokens)

    def collect(self, step: Launched) -> np.ndarray:
        return step.tokens

    def retire(self, retired: Retired) -> None:
        for hole, mover in zip(retired.holes, retired.movers, strict=True):
            self.rows[hole] = self.rows[mover]
        for row in range(retired.keep, retired.old_n):
            self.rows[row] = None
        self._clear(retired.freed)
        self._own(retired.owners.pages, retired.owners.rows, retired.owners.logical)

    def _own(self, pages: list[int], rows: list[int], logical: list[int]) -> None:
        for page, row, place in zip(pages, rows, logical, strict=True):
            self.owners[page] = (row, place)

    def _clear(self, pages: list[int]) -> None:
        for page in pages:
            self.owners.pop(page, None)


@dataclass
class Outcomes:
    """What the callers got: answers by request, streamed tokens, requests forgotten."""

    finished: dict[str, list[int]] = field(default_factory=dict)
    streamed: dict[str, list[int]] = field(default_factory=dict)
    forgotten: set[str] = field(default_factory=set)
    failed: dict[str, ServiceError] = field(default_factory=dict)

    def joined(self, joined: Joined) -> None:
        self.forget(joined.dropped)
        self.finish(joined.finished)
        self.stream((sequence.request_id, token) for _, sequence, token in joined.rows)

    def stream(self, pieces: Iterable[tuple[str, int]]) -> None:
        for request_id, token in pieces:
            self.streamed.setdefault(request_id, []).append(token)

    def finish(self, finished: Seq[Finished]) -> None:
        for done in finished:
            assert done.sequence.request_id not in self.finished, "answered twice"
            self.finished[done.sequence.request_id] = done.tokens

    def forget(self, request_ids: Iterable[str]) -> None:
        self.forgotten.update(request_ids)

    def fail(self, sequences: Iterable[Sequence], error: ServiceError) -> None:
        for sequence in sequences:
            self.failed[sequence.request_id] = error


PAGE = 4


def scheduler(rows: int = 4, prefill: int = 16, pages: int = 64, max_new: int = 16) -> Scheduler:
    return Scheduler(
        rows=rows,
        prefill_tokens=prefill,
        pages=PageManager(pages),
        page_size=PAGE,
        max_positions=128,
        max_new_tokens=max_new,
        eos=[EOS],
    )


def request(
    name: str,
    prompt: int,
    max_new: int = 8,
    streams: bool = False,
    deadline: float | None = None,
) -> Sequence:
    return Sequence(
        request_id=name,
        prompt=tuple(range(1, prompt + 1)),
        max_new=max_new,
        parameters=GREEDY,
        streams=streams,
        submitted=0.0,
        deadline=deadline,
    )


def expected(name: str, max_new: int, eos_at: dict[str, int]) -> list[int]:
    """What a request must generate: up to and with its EOS, at most ``max_new`` tokens."""
    tokens = []
    for index in range(max_new):
        tokens.append(token_of(name, index, eos_at))
        if tokens[-1] == EOS:
            break
    return tokens


def run(stepper: Stepper[Launched, list[int]], limit: int = 500) -> int:
    steps = 0
    while stepper.busy():
        stepper.step()
        steps += 1
        assert steps < limit, "the scheduler stopped making progress"
    return steps


def test_admission_stops_at_the_rows() -> None:
    s = scheduler(rows=2)
    for name in "abcd":
        assert s.add(request(name, 3)) is None
    chunks = s.schedule_prefill()
    assert [c.sequence.request_id for c in chunks] == ["a", "b"]
    assert all(c.completes for c in chunks)
    s.join([c.sequence for c in chunks], [5, 5])
    assert s.waiting == 2
    assert s.running == 2
    assert not s.schedule_prefill()  # no row is free


def test_a_request_whose_deadline_passed_while_it_waited_never_reaches_the_model() -> None:
    # One row: "held" runs while "late" (its deadline about to pass) and "patient" wait.
    s = scheduler(rows=1)
    outcomes, device = Outcomes(), FakeDevice({})
    stepper = Stepper(s, device, outcomes)
    s.add(request("held", 3, max_new=4))
    stepper.step()
    late = request("late", 3, deadline=time.monotonic() + 0.05)
    s.add(late)
    s.add(request("patient", 3, max_new=2, deadline=time.monotonic() + 3600))
    time.sleep(0.06)  # the deadline passes; no cancel comes (the API's is still on its way)
    run(stepper)
    assert "late" not in device.prefilled
    assert isinstance(outcomes.failed["late"], DeadlineExceeded)
    assert set(outcomes.finished) == {"held", "patient"}
    assert s.pages.committed == 0
    assert not s.take_expired()


def test_admission_waits_for_pages_and_takes_them_when_one_finishes() -> None:
    # 9 usable pages; each request commits pages_for(8 + 8) = 4, so two fit and the third waits.
    s = scheduler(rows=4, pages=10)
    outcomes, device = Outcomes(), FakeDevice({})
    stepper = Stepper(s, device, outcomes)
    for name in "abc":
        s.add(request(name, 8, max_new=8))
    stepper.step()
    assert s.running == 2
    assert s.waiting == 1
    assert s.pages.committed == 8
    steps = run(stepper)
    assert set(outcomes.finished) == {"a", "b", "c"}
    assert stepper.times.steps == steps + 1  # and the one above
    times = stepper.times
    assert 0 < times.decodes <= times.steps
    # Every prompt token prefilled once, in two prefills (c waited for a's and b's pages).
    assert (times.prefills, times.prefill_tokens) == (2, 3 * 8)
    # Seven tokens of each come from decode steps (the first from its prefill); a step launched
    # before its rows finished counts them too.
    assert 3 * 7 <= times.decode_rows <= 2 * times.decodes
    assert s.pages.committed == 0
    assert s.pages.free == s.pages.usable


def test_a_long_prompt_is_prefilled_in_chunks_and_a_short_one_fills_the_rest() -> None:
    s = scheduler(prefill=8)
    s.add(request("long", 20))
    s.add(request("short", 3))
    first = s.schedule_prefill()
    assert [(c.sequence.request_id, c.start, c.count, c.completes) for c in first] == [
        ("long", 0, 8, False)
    ]
    second = s.schedule_prefill()
    assert [(c.start, c.count) for c in second] == [(8, 8)]
    third = s.schedule_prefill()
    # The long prompt's last 4 tokens, then the short prompt in the chunk's room.
    assert [(c.sequence.request_id, c.start, c.count, c.completes) for c in third] == [
        ("long", 16, 4, True),
        ("short", 0, 3, True),
    ]


def test_end_of_sequence_at_the_first_token_or_a_budget_of_one_takes_no_row() -> None:
    s = scheduler()
    eos_at = {"eos": 0}
    outcomes = Outcomes()
    stepper = Stepper(s, FakeDevice(eos_at), outcomes)
    s.add(request("eos", 5))
    s.add(request("one", 5, max_new=1))
    stepper.step()
    assert s.decoding == 0
    assert outcomes.finished == {"eos": [EOS], "one": [token_of("one", 0, eos_at)]}
    assert s.pages.committed == 0


def test_a_row_takes_a_page_when_its_next_position_starts_one() -> None:
    s = scheduler()
    s.add(request("a", PAGE))  # the prompt fills one page exactly
    chunks = s.schedule_prefill()
    s.join([chunks[0].sequence], [5])
    plan = s.schedule_decode()
    assert plan is not None
    assert plan.grown.rows == [0]
    assert plan.grown.logical == [1]
    assert chunks[0].sequence.pages == [*chunks[0].sequence.pages[:1], plan.grown.pages[0]]
    again = s.schedule_decode()
    assert again is not None
    assert not again.grown.pages


def test_finished_rows_are_filled_by_the_last_ones() -> None:
    s = scheduler(rows=4)
    names = ["a", "b", "c", "d"]
    for name in names:
        s.add(request(name, 3))
    completing = [c.sequence for c in s.schedule_prefill()]
    s.join(completing, [5, 5, 5, 5])
    plan = s.schedule_decode()
    assert plan is not None
    assert plan.rows == 4
    tokens = np.array([EOS, 7, 7, EOS])  # rows 0 and 3 end
    update = s.update(plan.rows, tokens)
    assert update.finished == {0, 3}
    ending = [*completing[0].pages, *completing[3].pages]
    retired = s.retire(sorted(update.finished))
    assert (retired.holes, retired.movers, retired.keep) == ([0], [2], 2)
    assert [f.sequence.request_id for f in retired.finished] == ["a", "d"]
    assert [f.tokens for f in retired.finished] == [[5, EOS], [5, EOS]]
    # Row 0 now holds "c": its pages are re-owned by row 0; the finished ones' pages freed.
    c = completing[2]
    assert retired.owners.pages == c.pages
    assert set(retired.owners.rows) == {0}
    assert sorted(retired.freed) == sorted(ending)
    assert s.rows.held(0) is c
    assert s.rows.held(1) is completing[1]


def test_a_step_read_after_rows_moved_is_read_in_their_new_places() -> None:
    """A step launched before rows finished ran in the rows as they were: read through the
    move, the finished rows' tokens are dropped and the movers' land in the holes."""
    s = scheduler(rows=3)
    for name in "abc":
        s.add(request(name, 3))
    s.join([c.sequence for c in s.schedule_prefill()], [5, 6, 7])
    first = s.schedule_decode()
    second = s.schedule_decode()  # launched before the first is read
    assert first is not None
    assert second is not None
    update = s.update(first.rows, np.array([EOS, 8, 9]))  # row 0 ("a") ends
    retired = s.retire(sorted(update.finished))
    tokens, rows = retired.remap(np.array([1, 10, 11]))  # the second step, old places
    assert rows == 2
    assert list(tokens) == [11, 10]  # "c" moved into row 0
    s.update(rows, tokens)
    assert s.rows.tokens(0) == [7, 9, 11]
    assert s.rows.tokens(1) == [6, 8, 10]


def test_a_waiting_request_cancelled_is_dropped_at_once_and_a_running_one_at_its_next_step() -> (
    None
):
    s = scheduler(rows=1)
    outcomes, device = Outcomes(), FakeDevice({})
    stepper = Stepper(s, device, outcomes)
    s.add(request("running", 3, max_new=16))
    s.add(request("waiting", 3))
    stepper.step()
    stepper.step()
    assert s.cancel(["waiting"]) == ["waiting"]
    assert s.waiting == 0
    assert s.cancel(["running"]) == []
    run(stepper)
    assert outcomes.finished == {}
    assert "running" in outcomes.forgotten
    assert s.pages.committed == 0
    assert s.pages.free == s.pages.usable


@pytest.mark.parametrize(
    ("prompt", "max_new", "pages", "error"),
    [
        (0, 8, 64, InvalidInput),
        (125, 8, 64, InvalidInput),  # 133 positions of a model of 128
        (40, 8, 8, OutOfMemory),  # 12 pages of a cache of 7
    ],
    ids=["empty", "too-long", "more-than-the-cache"],
)
def test_what_can_never_run_is_refused(
    prompt: int, max_new: int, pages: int, error: type[ServiceError]
) -> None:
    s = scheduler(pages=pages)
    assert isinstance(s.add(request("x", prompt, max_new)), error)
    assert not s.has_work()


def test_a_budget_is_cut_to_the_rows_most() -> None:
    s = scheduler(max_new=6)
    r = request("a", 3, max_new=1000)
    assert s.add(r) is None
    assert r.max_new == 6


def test_a_failure_lets_everything_go_and_answers_everyone_not_cancelled() -> None:
    s = scheduler(rows=2)
    outcomes, device = Outcomes(), FakeDevice({})
    stepper = Stepper(s, device, outcomes)
    for name in "abc":
        s.add(request(name, 3))
    stepper.step()
    s.cancel(["b"])
    stepper.fail_all(ServiceError("boom"))
    assert set(outcomes.failed) == {"a", "c"}
    assert "b" in outcomes.forgotten
    assert not stepper.busy()
    assert s.pages.committed == 0
    assert s.pages.free == s.pages.usable
    assert all(row is None for row in device.rows[:2])


# Requests (name, prompt length, budget, streams), EOS index by request, cancels by step.
Workload = tuple[list[tuple[str, int, int, bool]], dict[str, int], dict[int, list[str]]]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    count = draw(st.integers(1, 24))
    requests = []
    eos_at: dict[str, int] = {}
    cancels: dict[int, list[str]] = {}
    for index in range(count):
        name = f"r{index}"
        prompt = draw(st.integers(1, 40))
        max_new = draw(st.integers(1, 20))
        streams = draw(st.booleans())
        requests.append((name, prompt, max_new, streams))
        if draw(st.booleans()):
            eos_at[name] = draw(st.integers(0, 20))
        if draw(st.integers(0, 4)) == 0:
            cancels.setdefault(draw(st.integers(0, 30)), []).append(name)
    return requests, eos_at, cancels


@settings(max_examples=150, deadline=None)
@given(
    workload=workloads(),
    rows=st.integers(1, 6),
    prefill=st.integers(1, 48),
    pages=st.integers(8, 60),
    arrivals=st.integers(1, 8),
)
def test_every_request_gets_exactly_its_tokens_or_its_one_outcome(
    workload: Workload,
    rows: int,
    prefill: int,
    pages: int,
    arrivals: int,
) -> None:
    """Requests arriving a few per step, cancels at random steps: each request is answered with
    the tokens its rows produced (to its EOS or budget), or refused, or dropped when cancelled,
    once; the pages add up after every step and all come back at the end."""
    requests, eos_at, cancels = workload
    s = scheduler(rows=rows, prefill=prefill, pages=pages, max_new=20)
    outcomes, device = Outcomes(), FakeDevice(eos_at)
    stepper = Stepper(s, device, outcomes)
    refused: set[str] = set()
    held: dict[str, Sequence] = {}
    pending = list(requests)
    for step in range(1000):
        for name, prompt, max_new, streams in pending[:arrivals]:
            sequence = request(name, prompt, max_new, streams)
            if s.add(sequence) is not None:
                refused.add(name)
            else:
                held[name] = sequence
        pending = pending[arrivals:]
        outcomes.forget(s.cancel(cancels.get(step, [])))
        if not pending and not stepper.busy():
            break
        if stepper.busy():
            stepper.step()
        holding = [p for r in held.values() for p in r.pages]
        assert len(holding) == len(set(holding)), "a page held by two requests"
        assert s.pages.free + len(holding) == s.pages.usable
        assert s.pages.committed <= s.pages.usable
        for row in range(s.decoding):
            sequence = s.rows.held(row)
            assert all(device.owners[p] == (row, i) for i, p in enumerate(sequence.pages))
    else:
        pytest.fail("did not finish")
    cancelled = {name for names in cancels.values() for name in names}
    for name, _prompt, max_new, streams in requests:
        outcome_count = (
            (name in refused) + (name in outcomes.finished) + (name in outcomes.forgotten)
        )
        assert outcome_count == 1, name
        if name in outcomes.finished:
            want = expected(name, max_new, eos_at)
            assert outcomes.finished[name] == want
            if streams:
                # Every token but the last (the one that ended it) was streamed, in order.
                assert outcomes.streamed.get(name, []) == want[:-1]
        elif name in outcomes.forgotten:
            assert name in cancelled
    assert s.pages.committed == 0
    assert s.pages.free == s.pages.usable
    assert not device.owners
