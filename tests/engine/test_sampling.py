"""Any sampling values a client can send give the fast engine's sampler a token to draw."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract.types import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TEMPERATURE,
    Decoding,
)
from service.engine.fast.sampler import RowSampling, sample, top_candidates
from service.engine.fast.sequence import RowParameters


@settings(max_examples=200, deadline=None)
@given(
    temperature=st.floats(allow_nan=True, allow_infinity=True),
    top_k=st.integers(min_value=-(10**30), max_value=10**30),
    top_p=st.floats(allow_nan=True, allow_infinity=True),
    penalty=st.floats(allow_nan=True, allow_infinity=True),
    greedy=st.booleans(),
    seen=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_any_sampling_values_are_clamped_where_the_arithmetic_is_defined(
    temperature: float, top_k: int, top_p: float, penalty: float, greedy: bool, seen: list[bool]
) -> None:
    """A client's temperature of 1e-300 once made the engine sample from NaN (issue 34)."""
    decoding = Decoding(greedy, temperature, top_k, top_p, penalty)
    assert MIN_TEMPERATURE <= decoding.temperature <= MAX_TEMPERATURE
    assert 0 <= decoding.top_k <= MAX_TOP_K
    assert 0 < decoding.top_p <= 1
    assert MIN_REPETITION_PENALTY <= decoding.repetition_penalty <= MAX_REPETITION_PENALTY
    row = RowParameters.of(decoding)
    rows = RowSampling(
        greedy=torch.tensor([row.greedy]),
        temperature=torch.tensor([row.temperature]),
        top_k=torch.tensor([row.top_k]),
        top_p=torch.tensor([row.top_p]),
        penalty=torch.tensor([row.penalty]),
        seen=torch.tensor([seen]),
    )
    # Logits at float32's extremes, as a model's can be.
    logits = torch.tensor([[30_000.0, -30_000.0, 0.0, 1.0]])
    for _ in range(5):
        (token,) = sample(logits, rows, row.full_sort).tolist()
        assert 0 <= token < 4
        # The largest logit can never lose to the smallest once penalized either way.
        assert token != 1


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    width=st.integers(1, 300),
    chunk=st.sampled_from([8, 16, 32]),
    k=st.integers(1, 64),
    masked=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
def test_the_two_stage_top_k_picks_what_one_selection_picks(
    rows: int, width: int, chunk: int, k: int, masked: int, seed: int
) -> None:
    # Distinct values, so that the order is defined; a row's masked tokens (-inf) as many as
    # the test asks, even all but none of the row's.
    k = min(k, width, chunk)
    generator = torch.Generator().manual_seed(seed)
    values = torch.stack([torch.randperm(width, generator=generator) for _ in range(rows)]).float()
    values[0, : min(masked, width)] = -torch.inf
    wanted, wanted_at = torch.topk(values, k, dim=-1)
    got, got_at = top_candidates(values, k, two_stage=True, chunk=chunk)
    assert torch.equal(got, wanted)
    finite = wanted.isfinite()
    assert torch.equal(got_at[finite], wanted_at[finite])
    # A masked place may name any index (the padding's, clamped): inside the row, never drawn.
    assert int(got_at.max()) < width
    assert torch.equal(values.gather(-1, got_at)[finite], got[finite])


def test_two_stage_sampling_draws_the_same_tokens() -> None:
    # The same logits and the race's same draws: the same token, for the model card's sampling
    # and for greedy rows, over a vocabulary the chunks do not divide.
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5000, generator=generator) * 4
    card = RowParameters.of(Decoding(False, 0.7, 20, 0.6, 1.05))
    rows = RowSampling(
        greedy=torch.tensor([False, False, False, False, True, False]),
        temperature=torch.full((6,), card.temperature),
        top_k=torch.tensor([card.top_k, 1, 64, 5, 20, 20]),
        top_p=torch.tensor([card.top_p, 1.0, 1.0, 0.9, 0.6, 1.0]),
        penalty=torch.full((6,), card.penalty),
        seen=torch.rand(6, 5000, generator=generator) < 0.01,
    )
    for _ in range(20):
        noise = torch.empty(6, 64).exponential_(generator=generator)
        one = sample(logits, rows, False, noise)
        two = sample(logits, rows, False, noise, two_stage=True)
        assert torch.equal(one, two)
