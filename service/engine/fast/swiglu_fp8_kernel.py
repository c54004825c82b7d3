"""The Triton kernel behind ``swiglu_fp8.quantized`` (``swiglu_fp8.py`` says what it does).

Its own module, so that ``swiglu_fp8.py`` imports where there is no Triton (a CPU build of torch
has none): there this module's import fails and the kernel is never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def swiglu_fp8(  # type: ignore[no-untyped-def]
    gate_up_ptr,
    out_ptr,
    scale_ptr,
    rows,
    stride_in,
    stride_out,
    inter: tl.constexpr,
    block: tl.constexpr,
    fp8_max: tl.constexpr,
):
    # One program a row (the rows past ``rows`` are ``_scaled_mm``'s padding: zeros). Each
    # product is rounded to the model's dtype where the eager ``silu(gate) * up`` rounds it,
    # then scaled and cast as ``linear.fp8_linear`` scales and casts the row.
    row = tl.program_id(0)
    offsets = tl.arange(0, block)
    inside = offsets < inter
    live = inside & (row + tl.zeros_like(offsets) < rows)  # a block of masks, not a scalar
    source = gate_up_ptr + row.to(tl.int64) * stride_in + offsets
    gate = tl.load(source, mask=live, other=0.0)
    up = tl.load(source + inter, mask=live, other=0.0)
    g = gate.to(tl.float32)
    # The sigmoid from exp(-|g|), which never overflows (torch's exp(-g) goes to infinity).
    e = tl.exp(-tl.abs(g))
    sigmoid = tl.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    silu = (g * sigmoid).to(gate.dtype).to(tl.float32)
    h = (silu * up.to(tl.float32)).to(gate.dtype).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12) / fp8_max
    quantized = tl.minimum(tl.maximum(h / scale, -fp8_max), fp8_max)
    target = out_ptr + row.to(tl.int64) * stride_out + offsets
    tl.store(target, quantized.to(out_ptr.dtype.element_ty), mask=inside)
    tl.store(scale_ptr + row, scale)
