"""The Triton kernels behind ``slots.copy_slots`` and ``slots.gather_kv`` (``slots.py`` says
what they do).

Their own module, so that ``slots.py`` imports where there is no Triton (a CPU build of torch
has none): there this module's import fails and the kernels are never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _offsets(slot, stride_head, stride_slot, kv_heads, heads: tl.constexpr, dim: tl.constexpr):  # type: ignore[no-untyped-def]
    # One slot's keys (or values) of every head, ``[heads, dim]``: 64-bit, since a layer's
    # cache spans more elements than a 32-bit offset reaches on a large card.
    head = tl.arange(0, heads)[:, None]
    offsets = head.to(tl.int64) * stride_head + slot * stride_slot + tl.arange(0, dim)[None, :]
    return offsets, head < kv_heads


@triton.jit  # type: ignore[untyped-decorator]
def copy_slots(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    source_ptr,
    target_ptr,
    stride_head,
    stride_slot,
    kv_heads,
    heads: tl.constexpr,
    dim: tl.constexpr,
):
    # One program a copy: the keys and values of every head at one slot to another.
    i = tl.program_id(0)
    source = tl.load(source_ptr + i).to(tl.int64)
    target = tl.load(target_ptr + i).to(tl.int64)
    read, live = _offsets(source, stride_head, stride_slot, kv_heads, heads, dim)
    write, _ = _offsets(target, stride_head, stride_slot, kv_heads, heads, dim)
    tl.store(key_ptr + write, tl.load(key_ptr + read, mask=live), mask=live)
    tl.store(value_ptr + write, tl.load(value_ptr + read, mask=live), mask=live)


@triton.jit  # type: ignore[untyped-decorator]
def read_slots(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    slots_ptr,
    keys_out_ptr,
    values_out_ptr,
    stride_head,
    stride_slot,
    kv_heads,
    heads: tl.constexpr,
    dim: tl.constexpr,
):
    # One program a slot: its keys and values of every head, in the outputs' dtype, as row
    # ``i`` of ``[slots, kv_heads, dim]``.
    i = tl.program_id(0)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    read, live = _offsets(slot, stride_head, stride_slot, kv_heads, heads, dim)
    head = tl.arange(0, heads)[:, None]
    write = i.to(tl.int64) * kv_heads * dim + head * dim + tl.arange(0, dim)[None, :]
    dtype = keys_out_ptr.dtype.element_ty
    tl.store(keys_out_ptr + write, tl.load(key_ptr + read, mask=live).to(dtype), mask=live)
    tl.store(values_out_ptr + write, tl.load(value_ptr + read, mask=live).to(dtype), mask=live)
