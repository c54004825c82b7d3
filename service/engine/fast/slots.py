"""A prefill's moves of keys and values between cache slots, each one kernel of the engine's own
for both kinds and every head.

A prefill step that reuses kept prefix blocks copies their keys and values into the prompts'
own slots (and its freshly written blocks out to the kept pages), then reads every sequence's
keys and values back for the varlen attention (``prefill.PackedPrefill``). In torch each is an
``index_select`` and an ``index_copy_`` per kind per layer; in a captured step, padded to its
bucket's shapes, those small indexing kernels took a good part of a steady state's prefill.
``copy_slots`` and ``gather_kv`` do the same in one launch each, a program a slot.

The kernels are in ``slots_kernel.py``; the engine takes them where it takes the fused RoPE
kernel (``rope.runs``, ``HYMT_FAST_FUSED_ROPE``), which writes the step's keys and values
beside them; elsewhere ``cache.PagedKVCache``'s torch code does.
"""

from __future__ import annotations

from typing import Any

import torch

from service.engine.fast.cache import KV_FP8

# Bound at import, as ``rope`` binds its kernel.
_copy: Any
_read: Any
try:
    from service.engine.fast.slots_kernel import copy_slots as _copy
    from service.engine.fast.slots_kernel import read_slots as _read
except ImportError:  # no Triton (a CPU build of torch)
    _copy = _read = None


def _raw(cache: torch.Tensor) -> torch.Tensor:
    """An 8-bit cache as its bytes: a copy moves bits, whatever they mean."""
    return cache.view(torch.uint8) if cache.dtype == KV_FP8 else cache


def _shape(cache: torch.Tensor) -> dict[str, int]:
    kv_heads, _, dim = cache.shape
    return {
        "stride_head": cache.stride(0),
        "stride_slot": cache.stride(1),
        "kv_heads": kv_heads,
        "heads": 1 << max(0, kv_heads - 1).bit_length(),  # a Triton block: a power of two
        "dim": dim,
    }


def copy_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, source: torch.Tensor, target: torch.Tensor
) -> None:
    """One layer's keys and values at slots ``source`` copied to slots ``target`` (the two sets
    disjoint, but for a slot copied onto itself, as a captured step's padding is)."""
    if len(source):
        keys, values = _raw(key_cache), _raw(value_cache)
        _copy[(len(source),)](keys, values, source, target, **_shape(keys), num_warps=1)


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's keys and values at ``slots``, ``[len(slots), kv_heads, head_dim]`` each, in
    ``dtype``."""
    kv_heads, _, dim = key_cache.shape
    keys = torch.empty(len(slots), kv_heads, dim, dtype=dtype, device=key_cache.device)
    values = torch.empty_like(keys)
    if len(slots):
        _read[(len(slots),)](
            key_cache, value_cache, slots, keys, values, **_shape(key_cache), num_warps=1
        )
    return keys, values
