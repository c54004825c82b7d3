"""The Triton kernels behind ``quant_gemv.one_row`` and ``quant_gemv.rows`` for int8 weights, and
``quant_gemv.dequantized`` for both formats (``quant_gemv.py`` says what they compute).

Their own module, so that ``quant_gemv.py`` imports where there is no Triton (a CPU build of torch
has none): there this module's import fails and the kernel is never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _weights(  # type: ignore[no-untyped-def]
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    rows,
    row_ok,
    start,
    inputs,
    stride_w,
    stride_m,
    dtype: tl.constexpr,
    four_bit: tl.constexpr,
    nested: tl.constexpr,
    block: tl.constexpr,
    group: tl.constexpr,
    block_k: tl.constexpr,
):
    """A slice of ``block_k`` inputs of ``rows`` as ``[rows, block_k]`` weights of ``dtype``,
    dequantized as bitsandbytes does (float32, rounded once to ``dtype``)."""
    if four_bit:
        # A byte holds two inputs' codes, the first in its high half: both looked up, then
        # interleaved back into the inputs' order, so that the activations and the output are
        # read and written contiguously (vector accesses) rather than at every other element.
        pairs = start // 2 + tl.arange(0, block_k // 2)
        mask = row_ok[:, None] & (pairs < inputs // 2)[None, :]
        at_w = w_ptr + rows.to(tl.int64)[:, None] * stride_w + pairs[None, :]
        packed = tl.load(at_w, mask=mask, other=0)
        high = tl.load(code_ptr + (packed >> 4).to(tl.int32))
        low = tl.load(code_ptr + (packed & 15).to(tl.int32))
        codes = tl.reshape(tl.join(high, low), (rows.shape[0], block_k))
        # One maximum per block of inputs, loaded once and spread over its block: a load per
        # weight (several with the nested maxima) costs more than the weight's own bytes.
        blocks = start // block + tl.arange(0, block_k // block)
        block_ok = row_ok[:, None] & (blocks < inputs // block)[None, :]
        at = rows.to(tl.int64)[:, None] * stride_m + blocks[None, :]
        if nested:
            quantized = tl.load(maxima_ptr + at, mask=block_ok, other=0).to(tl.int32)
            grouped = at // group
            maxima = tl.load(nested_code_ptr + quantized) * tl.load(
                nested_absmax_ptr + grouped, mask=block_ok, other=0.0
            ) + tl.load(nested_offset_ptr + grouped, mask=block_ok, other=0.0)
        else:
            maxima = tl.load(maxima_ptr + at, mask=block_ok, other=0.0)
        spread = tl.broadcast_to(maxima[:, :, None], (rows.shape[0], block_k // block, block))
        weights = (codes * tl.reshape(spread, (rows.shape[0], block_k))).to(dtype)
    else:
        cols = start + tl.arange(0, block_k)
        mask = row_ok[:, None] & (cols < inputs)[None, :]
        at_w = w_ptr + rows.to(tl.int64)[:, None] * stride_w + cols[None, :]
        values = tl.load(at_w, mask=mask)
        row_max = tl.load(maxima_ptr + rows, mask=row_ok, other=0.0)
        # bitsandbytes' int8 step, 1 / 127, as the float32 it multiplies by.
        weights = (values.to(tl.float32) * row_max[:, None] * 7.874015718698502e-3).to(dtype)
    return weights


@triton.jit
def int8_as_float(values):  # type: ignore[no-untyped-def]
    """int8 values as float32, exactly, without a conversion instruction: the value added to
    the bits of 1.5 * 2**23 (it lands in the mantissa) and that number subtracted again.
    Converting each weight (int8 to float32, as ``.to`` compiles) runs on the GPU's conversion
    units at a fraction of its arithmetic's rate, the likely reason the one-row int8 product
    read its bytes far under the memory's pace (docs/benchmarks.md); an integer add and a float
    subtract run at full rate."""
    return (values.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit  # type: ignore[untyped-decorator]
def int8_as(values, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """int8 values as ``dtype`` (float16, bfloat16 or float32), exactly, without a conversion
    instruction (``int8_as_float``'s reason): float16's bits built around 1,024 + 128 (an
    integer add, a half subtract); bfloat16's are the top half of the float32's, whose lower
    half is zero for every int8 value."""
    # One return: Triton compiles what follows a returning branch too, whatever its condition.
    if dtype == tl.float32:
        result = int8_as_float(values)
    elif dtype == tl.float16:
        biased = (values.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True)
        result = biased - 1152.0
    else:
        bits = int8_as_float(values).to(tl.int32, bitcast=True) >> 16
        result = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return result


@triton.jit  # type: ignore[untyped-decorator]
def _int8_slice(  # type: ignore[no-untyped-def]
    w_ptr, rows, row_ok, cols, inputs, stride_w, dtype: tl.constexpr
):
    """``[rows, cols]`` of an int8 weight as ``dtype`` values (unscaled)."""
    at_w = w_ptr + rows.to(tl.int64)[:, None] * stride_w + cols[None, :]
    values = tl.load(at_w, mask=row_ok[:, None] & (cols < inputs)[None, :], other=0)
    return int8_as(values, dtype)


@triton.jit
def _int8_step(maxima_ptr, rows, row_ok):  # type: ignore[no-untyped-def]
    """Each row's step: its absolute maximum over 127, as bitsandbytes' float32 multiplies."""
    return tl.load(maxima_ptr + rows, mask=row_ok, other=0.0) * 7.874015718698502e-3


@triton.jit  # type: ignore[untyped-decorator]
def int8_row(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    maxima_ptr,
    residual_ptr,
    out_ptr,
    rows_out,
    inputs,
    stride_w,
    swiglu: tl.constexpr,
    has_residual: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """``x @ W.T`` for one row ``x`` and int8 rows ``W``: the values as they are, each row's
    sum scaled by its maximum once at the end (as ``int8_rows`` does), so a weight costs no
    conversion instruction; ``swiglu`` and ``has_residual`` as ``finish_row``."""
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    # Sums kept per column slot and reduced once at the end.
    acc = tl.zeros([block_n, block_k], dtype=tl.float32)
    acc_up = tl.zeros([block_n, block_k], dtype=tl.float32)
    for start in range(0, inputs, block_k):
        cols = start + tl.arange(0, block_k)
        xs = tl.load(x_ptr + cols, mask=cols < inputs, other=0.0).to(tl.float32)
        values = _int8_slice(w_ptr, rows, row_ok, cols, inputs, stride_w, tl.float32)
        acc += values * xs[None, :]
        if swiglu:
            up_rows = rows + rows_out
            up = _int8_slice(w_ptr, up_rows, row_ok, cols, inputs, stride_w, tl.float32)
            acc_up += up * xs[None, :]
    out = tl.sum(acc, axis=1) * _int8_step(maxima_ptr, rows, row_ok)
    up_sum = tl.sum(acc_up, axis=1)
    if swiglu:
        up_sum = up_sum * _int8_step(maxima_ptr, rows + rows_out, row_ok)
    finish_row(out, up_sum, residual_ptr, out_ptr, rows, row_ok, swiglu, has_residual)


@triton.jit  # type: ignore[untyped-decorator]
def finish_row(  # type: ignore[no-untyped-def]
    out,
    up_sum,
    residual_ptr,
    out_ptr,
    rows,
    row_ok,
    swiglu: tl.constexpr,
    has_residual: tl.constexpr,
):
    """A one-row product's epilogue: ``silu(gate) * up`` of the two halves' sums when
    ``swiglu``, plus the residual when given, stored in the output's dtype at the offsets
    ``rows`` (any shape: several rows' outputs alike) where ``row_ok``."""
    dtype = out_ptr.dtype.element_ty
    if swiglu:
        # Each of the three values rounded to the model's dtype, as transformers' MLP does.
        gate = out.to(dtype).to(tl.float32)
        activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        out = activated * up_sum.to(dtype).to(tl.float32)
    if has_residual:
        out = out.to(dtype).to(tl.float32)
        out = out + tl.load(residual_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, out.to(dtype), mask=row_ok)


@triton.jit  # type: ignore[untyped-decorator]
def int8_rows(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    maxima_ptr,
    out_ptr,
    batch,
    rows_out,
    inputs,
    stride_x,
    stride_w,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """``x @ W.T`` for ``batch`` rows of ``x`` and int8 rows ``W``: a program's ``block_n``
    weight rows a slice at a time straight into the tensor cores' product with ``block_m``
    rows of ``x``, summed in float32, each output scaled by its row's maximum at the end: int8
    values are exact in 16 bits and a row's scale is one number, so there is no float work per
    weight and the product is rounded once."""
    dtype = out_ptr.dtype.element_ty
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    lines = tl.program_id(1) * block_m + tl.arange(0, block_m)
    line_ok = lines < batch
    x_lines = x_ptr + lines.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    for start in range(0, inputs, block_k):
        cols = start + tl.arange(0, block_k)
        col_ok = (cols < inputs)[None, :]
        xs = tl.load(x_lines + cols[None, :], mask=line_ok[:, None] & col_ok, other=0.0)
        weights = _int8_slice(w_ptr, rows, row_ok, cols, inputs, stride_w, dtype)
        acc = tl.dot(xs, tl.trans(weights), acc)
    acc = acc * _int8_step(maxima_ptr, rows, row_ok)[None, :]
    at = out_ptr + lines.to(tl.int64)[:, None] * rows_out + rows[None, :]
    tl.store(at, acc.to(dtype), mask=line_ok[:, None] & row_ok[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def dequantize(  # type: ignore[no-untyped-def]
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    out_ptr,
    rows_out,
    inputs,
    stride_w,
    stride_m,
    four_bit: tl.constexpr,
    nested: tl.constexpr,
    block: tl.constexpr,
    group: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """The weight as ``[rows_out, inputs]`` values of the output's dtype, each rounded as
    bitsandbytes' dequantization rounds it (``_weights``): a program's ``block_n`` rows, one
    slice of ``block_k`` inputs."""
    dtype = out_ptr.dtype.element_ty
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    start = tl.program_id(1) * block_k
    weights = _weights(
        w_ptr, maxima_ptr, code_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr,
        rows, row_ok, start, inputs, stride_w, stride_m,
        dtype, four_bit, nested, block, group, block_k,
    )  # fmt: skip
    cols = start + tl.arange(0, block_k)
    at = out_ptr + rows.to(tl.int64)[:, None] * inputs + cols[None, :]
    tl.store(at, weights, mask=row_ok[:, None] & (cols < inputs)[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def nested_maxima(  # type: ignore[no-untyped-def]
    quantized_ptr,
    code_ptr,
    absmax_ptr,
    offset_ptr,
    out_ptr,
    count,
    group: tl.constexpr,
    block: tl.constexpr,
):
    """bitsandbytes' double-quantized block maxima as float32, in one pass: ``code[q]`` times
    its group's ``absmax`` plus its group's ``offset`` (``linear.NestedMaxima``)."""
    at = tl.program_id(0) * block + tl.arange(0, block)
    ok = at < count
    quantized = tl.load(quantized_ptr + at, mask=ok, other=0).to(tl.int32)
    grouped = at // group
    maxima = tl.load(code_ptr + quantized) * tl.load(absmax_ptr + grouped, mask=ok, other=0.0)
    tl.store(out_ptr + at, maxima + tl.load(offset_ptr + grouped, mask=ok, other=0.0), mask=ok)
