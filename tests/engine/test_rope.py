"""The decode step's fused RoPE, query/key norm and cache write (``rope.py``) against the torch
code it replaces (``forward.attention_inputs`` and ``cache.write_kv``), in Triton's interpreter:
with the norms after the rotation (Hunyuan dense), before it (Hy-MT2-30B-A3B) and without them,
rows at positions of their own and writing to scattered cache slots."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from service.engine.fast import rope
from service.engine.fast.cache import KV_FP8, write_kv
from service.engine.fast.forward import rotate_and_normalise
from service.engine.fast.weights import Geometry

pytest.importorskip("triton")

GEOMETRY = Geometry(
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate=32,
    eps=1e-5,
    vocab=16,
    max_positions=64,
)
ROWS = 3
SLOTS = 40


@dataclasses.dataclass(frozen=True)
class Case:
    qkv: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    query_norm: torch.Tensor | None
    key_norm: torch.Tensor | None
    slots: torch.Tensor


def _case(dtype: torch.dtype, normed: bool) -> Case:
    torch.manual_seed(0)
    g = GEOMETRY
    positions = torch.tensor([0, 17, 63])
    angles = positions[:, None].float() * torch.linspace(0.1, 1.0, g.head_dim // 2)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return Case(
        qkv=torch.randn(ROWS, (g.heads + 2 * g.kv_heads) * g.head_dim).to(dtype),
        cos=angles.cos().to(dtype),
        sin=angles.sin().to(dtype),
        query_norm=(torch.rand(g.head_dim) + 0.5).to(dtype) if normed else None,
        key_norm=(torch.rand(g.head_dim) + 0.5).to(dtype) if normed else None,
        slots=torch.tensor([31, 2, 17]),
    )


def _caches(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = GEOMETRY
    keys = torch.full((g.kv_heads, SLOTS, g.head_dim), 7.0, dtype=dtype)
    return keys, keys.clone()


@pytest.mark.parametrize(
    ("normed", "norm_first"),
    [(True, False), (True, True), (False, False)],
    ids=["norm-after-rope", "norm-before-rope", "no-norm"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_program", [1, 3], ids=["a-head-a-program", "heads-in-turn"])
def test_kernel_equals_the_torch_code(
    normed: bool,
    norm_first: bool,
    dtype: torch.dtype,
    per_program: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by tests/conftest.py
    if per_program > 1:
        # As a wide batch runs it: heads three to a program (eight heads: the last program
        # has two, its third slot past the end).
        monkeypatch.setattr(rope, "_ONE_HEAD_UP_TO", 0)
        monkeypatch.setattr(rope, "_HEADS_PER_PROGRAM", per_program)
    g = dataclasses.replace(GEOMETRY, norm_before_rope=norm_first)
    c = _case(dtype, normed)
    q, k, v = rotate_and_normalise(c.qkv, c.query_norm, c.key_norm, c.cos, c.sin, g)
    keys, values = _caches(dtype)
    write_kv(keys, values, c.slots, k, v)

    fused_keys, fused_values = _caches(dtype)
    fused_q = rope.rope_and_store(
        c.qkv, c.cos, c.sin, c.query_norm, c.key_norm, fused_keys, fused_values, c.slots, g
    )

    # float32: the same arithmetic; bf16: Triton's interpreter truncates where the GPU rounds
    # to nearest, so within a few bf16 steps.
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(fused_q, q, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(fused_keys, keys, rtol=tolerance, atol=tolerance)
    # Values are copied, not computed: exact, and every slot not written keeps its contents.
    torch.testing.assert_close(fused_values, values, rtol=0, atol=0)
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[c.slots] = False
    assert bool((fused_keys[:, untouched] == 7.0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_8_bit_cache_stores_what_the_torch_code_stores(dtype: torch.dtype) -> None:
    # fast_kv_cache_dtype=fp8: the kernel writes keys and values as ``cache.write_kv`` stores
    # them, clamped to e4m3's largest and rounded to its 8 bits; the queries stay as they were.
    g = GEOMETRY
    c = _case(dtype, normed=True)
    c = dataclasses.replace(c, qkv=c.qkv * 300)  # some values past e4m3's 448: clamped
    q, k, v = rotate_and_normalise(c.qkv, c.query_norm, c.key_norm, c.cos, c.sin, g)
    keys, values = (cache.to(KV_FP8) for cache in _caches(dtype))
    write_kv(keys, values, c.slots, k, v)
    fused_keys, fused_values = (cache.to(KV_FP8) for cache in _caches(dtype))
    fused_q = rope.rope_and_store(
        c.qkv, c.cos, c.sin, c.query_norm, c.key_norm, fused_keys, fused_values, c.slots, g
    )
    assert fused_keys.dtype == fused_values.dtype == KV_FP8
    assert v.abs().max() > 448
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(fused_q, q, rtol=tolerance, atol=tolerance * 300)
    assert fused_values.float().abs().max() == 448
    # Keys and values within one e4m3 step (1/8 relative) of the torch code's, past bf16's own
    # rounding; all but a few: Triton's interpreter loses the carry where rounding a mantissa up
    # passes a power of two (1.94 becomes 1.0, not 2.0), which a GPU's conversion instruction
    # does not. Every slot not written keeps its contents.
    for fused, expected in ((fused_keys, keys), (fused_values, values)):
        close = torch.isclose(fused.float(), expected.float(), rtol=0.13, atol=0.02)
        assert close.float().mean() > 0.99
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[c.slots] = False
    assert bool((fused_keys[:, untouched].float() == 7.0).all())
