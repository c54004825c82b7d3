"""The Triton kernel behind ``gemv.one_row`` (``gemv.py`` says what it computes).

Its own module, so that ``gemv.py`` imports where there is no Triton (a CPU build of torch has
none): there this module's import fails and the kernel is never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def gemv(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    scale_ptr,
    residual_ptr,
    out_ptr,
    sum_in_ptr,
    sum_out_ptr,
    zero_ptr,
    rows_out,
    inputs,
    stride_w,
    eps,
    has_scale: tl.constexpr,
    swiglu: tl.constexpr,
    has_residual: tl.constexpr,
    has_norm: tl.constexpr,
    norm_from_sum: tl.constexpr,
    sum_out: tl.constexpr,
    zero_after: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    early_weights: tl.constexpr,
    pdl: tl.constexpr,
):
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    # Sums kept per column slot and reduced once at the end: no cross-lane reduction per
    # slice.
    acc = tl.zeros([block_n, block_k], dtype=tl.float32)
    acc_up = tl.zeros([block_n, block_k], dtype=tl.float32)
    squares = tl.zeros([block_k], dtype=tl.float32)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
    up_rows = w_ptr + (rows + rows_out).to(tl.int64)[:, None] * stride_w
    first = 0
    if early_weights:
        # The first slice of the weights is loaded before anything the kernel before this one
        # wrote (weights are never written): with programmatic dependent launch those loads
        # overlap that kernel's end.
        cols = tl.arange(0, block_k)
        col_ok = cols < inputs
        mask = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_rows + cols[None, :], mask=mask, other=0.0)
        if swiglu:
            u = tl.load(up_rows + cols[None, :], mask=mask, other=0.0)
    if pdl:
        # Launched with programmatic dependent launch: wait here for the kernel before this one
        # to finish (its writes visible), and let the next one start launching now.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if early_weights:
        xs = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if has_norm and not norm_from_sum:
            squares += xs * xs
        xs = xs[None, :]
        acc += w.to(tl.float32) * xs
        if swiglu:
            acc_up += u.to(tl.float32) * xs
        first = block_k
    for start in range(first, inputs, block_k):
        cols = start + tl.arange(0, block_k)
        col_ok = cols < inputs
        xs = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if has_norm and not norm_from_sum:
            squares += xs * xs
        xs = xs[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_rows + cols[None, :], mask=mask, other=0.0)
        acc += w.to(tl.float32) * xs
        if swiglu:
            u = tl.load(up_rows + cols[None, :], mask=mask, other=0.0)
            acc_up += u.to(tl.float32) * xs
    out = tl.sum(acc, axis=1)
    if has_norm:
        # With norm_from_sum the row's sum of squares was added up by the kernel that wrote it.
        total = tl.load(sum_in_ptr) if norm_from_sum else tl.sum(squares, axis=0)
        rstd = tl.math.rsqrt(total / inputs + eps)
        out = out * rstd
    if has_scale:
        out = out * tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    dtype = out_ptr.dtype.element_ty
    if swiglu:
        up = tl.sum(acc_up, axis=1)
        if has_norm:
            up = up * rstd
        if has_scale:
            up = up * tl.load(scale_ptr + rows + rows_out, mask=row_ok, other=0.0)
        gate = out.to(dtype).to(tl.float32)
        activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        out = activated * up.to(dtype).to(tl.float32)
    if has_residual:
        out = out.to(dtype).to(tl.float32)
        out = out + tl.load(residual_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    written = out.to(dtype)
    tl.store(out_ptr + rows, written, mask=row_ok)
    if sum_out:
        # This block's share of the output's sum of squares (of the values as stored), for
        # the norm that reads the output next.
        kept = tl.where(row_ok, written.to(tl.float32), 0.0)
        tl.atomic_add(sum_out_ptr, tl.sum(kept * kept, axis=0), sem="relaxed")
    # A sum whose readers have all run (the launch before this one), cleared for the next step;
    # the outer test is decided at compile time, the inner one per program.
    if zero_after:  # noqa: SIM102
        if tl.program_id(0) == 0:
            tl.store(zero_ptr, 0.0)
