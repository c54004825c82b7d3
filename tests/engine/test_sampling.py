"""Per-request sampling in one pass gives what transformers' warpers give, row by row."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from service.contract.types import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TEMPERATURE,
    MODEL_CARD_DECODING,
    Decoding,
)
from service.engine.sampling import NO_TOP_K, PerRequestSampling, request_kwargs


def _args(rows: list[dict[str, float | int]]) -> torch.Tensor:
    storage = torch.zeros((3, len(rows)), dtype=torch.int32)
    storage[0] = torch.tensor([r["temperature"] for r in rows]).float().view(torch.int32)
    storage[1] = torch.tensor([r["top_k"] for r in rows], dtype=torch.int32)
    storage[2] = torch.tensor([r["top_p"] for r in rows]).float().view(torch.int32)
    return storage


def test_rows_match_transformers_warpers() -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 300, generator=generator) * 3
    scores[4, 7] = scores[4, 9] = scores[4].max() + 1  # a tie for the top token
    decodings = [
        MODEL_CARD_DECODING,
        Decoding(greedy=False, temperature=1.3, top_k=0, top_p=0.9, repetition_penalty=1.0),
        Decoding(greedy=False, temperature=0.5, top_k=50, top_p=1.0, repetition_penalty=1.0),
        Decoding(greedy=False, temperature=1.0, top_k=3, top_p=0.2, repetition_penalty=1.0),
        Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0),
    ]
    rows = [request_kwargs(d) for d in decodings]
    fused = PerRequestSampling(MODEL_CARD_DECODING)(torch.zeros(5), scores.clone(), _args(rows))
    for index, row in enumerate(rows):
        # transformers' order: temperature, then top-k, then top-p over what top-k kept.
        expected = scores[index : index + 1] / float(row["temperature"])
        if row["top_k"] != NO_TOP_K:
            expected = TopKLogitsWarper(int(row["top_k"]))(None, expected)
        if row["top_p"] < 1.0:
            expected = TopPLogitsWarper(float(row["top_p"]))(None, expected)
        kept = torch.isfinite(fused[index])
        if index == 4:  # greedy: exactly the token argmax picks, though two tie
            assert kept.nonzero().flatten().tolist() == [int(scores[4].argmax())] == [7]
            continue
        assert torch.equal(kept, torch.isfinite(expected[0])), index
        assert torch.allclose(fused[index][kept], expected[0][kept])


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    temperature=st.floats(allow_nan=True, allow_infinity=True),
    top_k=st.integers(min_value=-(10**30), max_value=10**30),
    top_p=st.floats(allow_nan=True, allow_infinity=True),
    penalty=st.floats(allow_nan=True, allow_infinity=True),
    greedy=st.booleans(),
)
def test_any_sampling_values_are_clamped_where_the_arithmetic_is_defined(
    temperature: float, top_k: int, top_p: float, penalty: float, greedy: bool
) -> None:
    """A client's temperature of 1e-300 once made the engine sample from NaN (issue 34)."""
    decoding = Decoding(greedy, temperature, top_k, top_p, penalty)
    assert MIN_TEMPERATURE <= decoding.temperature <= MAX_TEMPERATURE
    assert 0 <= decoding.top_k <= MAX_TOP_K
    assert 0 < decoding.top_p <= 1
    assert MIN_REPETITION_PENALTY <= decoding.repetition_penalty <= MAX_REPETITION_PENALTY
    scores = torch.tensor([[30_000.0, -30_000.0, 0.0, 1.0]])
    kept = PerRequestSampling(decoding)(torch.zeros(1), scores, _args([request_kwargs(decoding)]))
    assert torch.isfinite(kept).any()
    assert not torch.isnan(kept).any()
    probabilities = torch.softmax(kept, dim=-1)
    assert torch.isfinite(probabilities).all()
    torch.multinomial(probabilities, 1)  # what failed on NaN
