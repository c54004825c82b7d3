"""A prefill's slot moves by the engine's own kernels (``slots.py``) against the torch code they
replace (``cache.PagedKVCache.copy`` and ``gather``), in Triton's interpreter: 16- and 32-bit
caches and an 8-bit one, a head count that is not a power of two, slots anywhere in the cache
and a slot copied onto itself (a captured step's padding)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast import slots
from service.engine.fast.cache import KV_FP8, CacheShape, PagedKVCache, stored
from service.engine.fast.weights import Geometry

pytest.importorskip("triton")

PAGES, PAGE_SIZE = 6, 8


def _cache(kv_heads: int, dtype: torch.dtype, compute: torch.dtype) -> PagedKVCache:
    g = Geometry(
        hidden=32, heads=2 * kv_heads, kv_heads=kv_heads, head_dim=16, intermediate=32,
        eps=1e-5, vocab=16, max_positions=64,
    )  # fmt: skip
    cache = PagedKVCache(g, 1, CacheShape(PAGES, PAGE_SIZE), dtype, torch.device("cpu"), compute)
    torch.manual_seed(0)
    for tensor in (cache.keys[0], cache.values[0]):
        tensor.copy_(stored(torch.randn(tensor.shape) * 4, dtype))
    return cache


CACHES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
          (KV_FP8, torch.bfloat16)]  # fmt: skip
SLOTS = PAGES * PAGE_SIZE


@settings(max_examples=12, deadline=None)
@given(
    kv_heads=st.sampled_from([1, 2, 3]),
    kinds=st.sampled_from(CACHES),
    moves=st.lists(st.integers(1, SLOTS - 1), min_size=2, max_size=16, unique=True),
    read=st.lists(st.integers(0, SLOTS - 1), max_size=20),
)
def test_the_kernels_move_what_torch_moves(
    kv_heads: int, kinds: tuple[torch.dtype, torch.dtype], moves: list[int], read: list[int]
) -> None:
    dtype, compute = kinds
    half = len(moves) // 2
    # Disjoint sources and targets, as the prefix cache makes them, and slot 0 onto itself.
    source = torch.tensor([*moves[:half], 0])
    target = torch.tensor([*moves[half : 2 * half], 0])
    ours, theirs = _cache(kv_heads, dtype, compute), _cache(kv_heads, dtype, compute)
    slots.copy_slots(ours.keys[0], ours.values[0], source, target)
    theirs.copy(0, source, target)
    for mine, wanted in ((ours.keys[0], theirs.keys[0]), (ours.values[0], theirs.values[0])):
        assert torch.equal(mine.view(torch.uint8), wanted.view(torch.uint8))
    picked = torch.tensor(read, dtype=torch.long)
    keys, values = slots.gather_kv(ours.keys[0], ours.values[0], picked, compute)
    want_keys, want_values = theirs.gather(0, picked)
    assert keys.dtype == compute
    assert torch.equal(keys, want_keys)
    assert torch.equal(values, want_values)
