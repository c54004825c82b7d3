"""A prefill step's layout in a captured step's fixed shapes (``prefill.HostPrefill.padded``):
whatever the pieces, the padded step is the real one followed by padding sequences no longer
than the bucket's longest and empty ones, and every bound a captured step's kernels read stays
inside its bucket."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast.prefill import Piece, layout, prefill_buckets

PAGE = 16


@st.composite
def steps(draw: st.DrawFn) -> list[Piece]:
    """Pieces of prompts: whole ones and chunks after cached keys, on pages of their own."""
    pieces, page = [], 1
    for _ in range(draw(st.integers(1, 40))):
        length = draw(st.integers(1, 600))
        start = draw(st.integers(0, length - 1))
        count = draw(st.integers(1, length - start))
        pages = list(range(page, page + -(-length // PAGE)))
        page += len(pages)
        seed = draw(st.integers(0, 2**16))
        prompt = tuple(np.random.default_rng(seed).integers(1, 999, length).tolist())
        pieces.append(Piece(prompt, pages, start, count))
    return pieces


@settings(max_examples=150, deadline=None)
@given(pieces=steps())
def test_a_step_padded_into_its_bucket_is_the_step_then_padding(pieces: list[Piece]) -> None:
    step = layout(pieces, PAGE)
    buckets = prefill_buckets(2048)
    bucket = next((b for b in buckets if step.fits(b)), None)
    tokens, count = len(step.tokens), len(step.cu_q)
    if bucket is None:  # too many tokens, sequences, keys or logits' rows for any bucket
        largest = buckets[-1]
        assert (
            tokens > largest.tokens
            or step.max_q > largest.queries
            or count - 1 > largest.sequences
            or len(step.key_slots) + largest.tokens - tokens > largest.keys
            or len(step.last) > largest.last
        )
        return
    # The smallest that fits: no smaller bucket would have.
    assert not any(step.fits(b) for b in buckets if b.tokens < bucket.tokens)
    flat = step.padded(bucket)
    assert flat.shape == (bucket.size,)
    parts = {name: flat[span] for name, span in bucket.spans.items()}
    padding = bucket.tokens - tokens
    # The real step, unchanged, first.
    for name in ("tokens", "positions", "slots"):
        assert np.array_equal(parts[name][:tokens], getattr(step, name))
        assert not parts[name][tokens:].any()  # token 0 at position 0 into scratch slot 0
    cu_q, cu_k = parts["cu_q"], parts["cu_k"]
    assert np.array_equal(cu_q[:count], step.cu_q)
    assert np.array_equal(cu_k[:count], step.cu_k)
    # Then padding sequences over the rest of the tokens (and as many keys), then empty ones;
    # no sequence longer than the bucket's longest, which the kernel's grid is sized by.
    assert (np.diff(cu_q) >= 0).all()
    assert (np.diff(cu_k) >= 0).all()
    assert np.diff(cu_q).max() <= bucket.queries
    assert cu_q[-1] == bucket.tokens
    assert cu_k[-1] == len(step.key_slots) + padding <= bucket.keys
    pads = np.diff(cu_q)[count - 1 :]
    assert pads.sum() == padding
    assert np.count_nonzero(pads) == -(-padding // bucket.queries)
    # Each sequence's keys end with its own queries (the kernel's causal alignment).
    assert (np.diff(cu_k) >= np.diff(cu_q)).all()
    assert np.array_equal(parts["key_slots"][: len(step.key_slots)], step.key_slots)
    assert not parts["key_slots"][len(step.key_slots) :].any()
    assert np.array_equal(parts["last"][: len(step.last)], step.last)
    assert (parts["last"] < bucket.tokens).all()
