"""The step loop's waits: a lone request's short steps are waited for spinning (the quickest
wake-up), a loaded engine's wide steps and prefills asleep, so that it holds no core while the
device works through tens of milliseconds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.engine.fast import waits


@given(rows=st.integers(1, 8))
def test_a_few_requests_steps_are_waited_for_spinning(rows: int) -> None:
    assert not waits.sleeps_for_decode(rows)


@given(rows=st.integers(256, 4096))
def test_a_loaded_engines_steps_are_waited_for_asleep(rows: int) -> None:
    assert waits.sleeps_for_decode(rows)


@given(tokens=st.integers(1, 512), decoding=st.integers(0, 8))
def test_a_lone_prompts_prefill_is_waited_for_spinning(tokens: int, decoding: int) -> None:
    assert not waits.sleeps_for_prefill(tokens, decoding)


@given(tokens=st.integers(1, 16384), decoding=st.integers(256, 4096))
def test_a_prefill_beside_a_loaded_step_is_waited_for_asleep(tokens: int, decoding: int) -> None:
    assert waits.sleeps_for_prefill(tokens, decoding)


@given(tokens=st.integers(4096, 16384))
def test_a_wide_prefill_is_waited_for_asleep(tokens: int) -> None:
    assert waits.sleeps_for_prefill(tokens, 0)
