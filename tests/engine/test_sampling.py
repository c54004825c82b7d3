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
from service.engine.fast.sampler import RowSampling, sample
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
