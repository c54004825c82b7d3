"""The Triton kernels that look 4-bit codes up in registers (``four_bit_lookup``'s PTX):
``four_bit_row`` for one row of activations, ``four_bit_rows`` for a few, ``four_bit_matmul``
for batches on the tensor cores (``quant_gemv.py`` says what they compute and which shapes take
them).

Their own module, so that ``quant_gemv.py`` imports where there is no Triton (a CPU build of torch
has none): there this module's import fails and the kernels are never used.
"""

from __future__ import annotations

import triton
import triton.language as tl

from service.engine.fast.four_bit_lookup import CONSTRAINTS, DOT_CONSTRAINTS, VALUES_CONSTRAINTS
from service.engine.fast.quant_gemv_kernel import finish_row

_LOOKUP_CONSTRAINTS = tl.constexpr(CONSTRAINTS)
_VALUES_CONSTRAINTS = tl.constexpr(VALUES_CONSTRAINTS)
_DOT_CONSTRAINTS = tl.constexpr(DOT_CONSTRAINTS)


@triton.jit  # type: ignore[untyped-decorator]
def four_bit_row(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    residual_ptr,
    out_ptr,
    rows_out,
    pairs,
    stride_w,
    stride_m,
    lookup: tl.constexpr,
    in_registers: tl.constexpr,
    nested: tl.constexpr,
    group: tl.constexpr,
    block_pairs: tl.constexpr,
    swiglu: tl.constexpr,
    has_residual: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """``x @ W.T`` for one row ``x`` (read as ``pairs`` 32-bit pairs of its 16-bit values) and
    the 4-bit codes ``W`` (a byte a pair of inputs, read as 32-bit words of four bytes:
    ``stride_w`` in words): a program's ``block_n`` rows in slices of ``block_k`` pairs, each
    word's eight codes looked up in registers and multiplied by ``lookup``
    (``four_bit_lookup.lookup_asm``, the table's words made here from the format's 16 float32
    values; read from memory instead where not ``in_registers``: ``_words_from_memory``), each
    block's sum (``block_pairs`` bytes) scaled by its maximum once (float32, or ``nested`` in
    bitsandbytes' double quantization, dequantized where it is read); ``gated`` and ``residual``
    as ``quant_gemv``."""
    dtype = out_ptr.dtype.element_ty
    low0, low1, low2, low3, high0, high1, high2, high3 = table_words(code_ptr, dtype)
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    acc = tl.zeros([block_n, block_k // block_pairs], dtype=tl.float32)
    acc_up = tl.zeros([block_n, block_k // block_pairs], dtype=tl.float32)
    for start in range(0, pairs, block_k):
        # The slice's pairs, four a word of codes (``pairs`` is a multiple of four).
        cols = start + 4 * tl.arange(0, block_k // 4)[:, None] + tl.arange(0, 4)[None, :]
        xs = tl.load(x_ptr + cols, mask=cols < pairs, other=0)
        acc += _four_bit_slice(
            w_ptr, maxima_ptr, code_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr,
            xs, low0, low1, low2, low3, high0, high1, high2, high3, rows, row_ok, start, pairs,
            stride_w, stride_m, lookup, in_registers, nested, group, dtype, block_pairs,
            block_n, block_k,
        )  # fmt: skip
        if swiglu:
            acc_up += _four_bit_slice(
                w_ptr, maxima_ptr, code_ptr, nested_code_ptr, nested_absmax_ptr,
                nested_offset_ptr, xs, low0, low1, low2, low3, high0, high1, high2, high3,
                rows + rows_out, row_ok, start, pairs, stride_w, stride_m, lookup, in_registers,
                nested, group, dtype, block_pairs, block_n, block_k,
            )  # fmt: skip
    finish_row(
        tl.sum(acc, axis=1), tl.sum(acc_up, axis=1), residual_ptr, out_ptr, rows, row_ok,
        swiglu, has_residual,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]
def table_words(code_ptr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """The eight table words ``four_bit_lookup`` reads: the low bytes' four, then the high
    bytes' (``table_word``)."""
    # fmt: off
    return (
        table_word(code_ptr, 0, False, dtype), table_word(code_ptr, 4, False, dtype),
        table_word(code_ptr, 8, False, dtype), table_word(code_ptr, 12, False, dtype),
        table_word(code_ptr, 0, True, dtype), table_word(code_ptr, 4, True, dtype),
        table_word(code_ptr, 8, True, dtype), table_word(code_ptr, 12, True, dtype),
    )
    # fmt: on


@triton.jit  # type: ignore[untyped-decorator]
def table_word(code_ptr, first, high: tl.constexpr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """The low (or ``high``) bytes of values ``first`` to ``first + 3`` of the float32 table at
    ``code_ptr``, rounded to ``dtype``, in one 32-bit word, value ``first + j`` at bits
    ``8 * j`` (``four_bit_lookup``'s layout)."""
    word = tl.zeros([], dtype=tl.int32)
    for j in tl.static_range(4):
        bits = _sixteen_bits(tl.load(code_ptr + first + j), dtype)
        byte = (bits >> 8) if high else (bits & 0xFF)
        word = word | (byte << (8 * j))
    return word


@triton.jit  # type: ignore[untyped-decorator]
def _sixteen_bits(value, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """The float32 ``value`` rounded to ``dtype``, its 16 bits in the low half of an int32."""
    if dtype == tl.bfloat16:
        # Rounded to nearest even by the bits (the top half of the float32's), as torch
        # rounds the weights it compares with.
        wide = value.to(tl.int32, bitcast=True)
        bits = ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16) & 0xFFFF
    else:
        bits = value.to(dtype).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits


@triton.jit  # type: ignore[untyped-decorator]
def _four_bit_slice(  # type: ignore[no-untyped-def]
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    xs,
    low0,
    low1,
    low2,
    low3,
    high0,
    high1,
    high2,
    high3,
    rows,
    row_ok,
    start,
    pairs,
    stride_w,
    stride_m,
    lookup: tl.constexpr,
    in_registers: tl.constexpr,
    nested: tl.constexpr,
    group: tl.constexpr,
    dtype: tl.constexpr,
    block_pairs: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """One slice of ``four_bit_row``: ``[block_n, block_k // block_pairs]`` block sums, each
    scaled by its maximum (codes and maxima out of range read as 0)."""
    codes = _codes(w_ptr, rows, row_ok, start, pairs, stride_w, block_k)
    if in_registers:
        sums = _words_in_registers(
            codes, xs, low0, low1, low2, low3, high0, high1, high2, high3, lookup, block_n,
            block_k,
        )  # fmt: skip
    else:
        sums = _words_from_memory(codes, xs, code_ptr, dtype, block_n, block_k)
    sums = tl.sum(tl.reshape(sums, (block_n, block_k // block_pairs, block_pairs // 4)), axis=2)
    maxima = _block_maxima(
        maxima_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr, rows, row_ok, start,
        pairs, stride_m, nested, group, block_pairs, block_k,
    )  # fmt: skip
    return sums * maxima


@triton.jit  # type: ignore[untyped-decorator]
def _codes(w_ptr, rows, row_ok, start, pairs, stride_w, block_k: tl.constexpr):  # type: ignore[no-untyped-def]
    """The slice's words of codes, ``[rows, block_k // 4]`` (0 out of range)."""
    words = start // 4 + tl.arange(0, block_k // 4)
    at = w_ptr + rows.to(tl.int64)[:, None] * stride_w + words[None, :]
    return tl.load(at, mask=row_ok[:, None] & (words < pairs // 4)[None, :], other=0)


@triton.jit  # type: ignore[untyped-decorator]
def _block_maxima(  # type: ignore[no-untyped-def]
    maxima_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    rows,
    row_ok,
    start,
    pairs,
    stride_m,
    nested: tl.constexpr,
    group: tl.constexpr,
    block_pairs: tl.constexpr,
    block_k: tl.constexpr,
):
    """The maximum of each block of the slice, ``[rows, block_k // block_pairs]`` (float32,
    or ``nested``: dequantized from bitsandbytes' double quantization; 0 out of range)."""
    blocks = start // block_pairs + tl.arange(0, block_k // block_pairs)
    block_ok = row_ok[:, None] & (blocks < pairs // block_pairs)[None, :]
    at = rows.to(tl.int64)[:, None] * stride_m + blocks[None, :]
    if nested:
        quantized = tl.load(maxima_ptr + at, mask=block_ok, other=0).to(tl.int32)
        grouped = at // group
        scale = tl.load(nested_absmax_ptr + grouped, mask=block_ok, other=0.0)
        offset = tl.load(nested_offset_ptr + grouped, mask=block_ok, other=0.0)
        maxima = tl.load(nested_code_ptr + quantized) * scale + offset
    else:
        maxima = tl.load(maxima_ptr + at, mask=block_ok, other=0.0)
    return maxima


@triton.jit  # type: ignore[untyped-decorator]
def _activations(xs, block_n: tl.constexpr, block_k: tl.constexpr):  # type: ignore[no-untyped-def]
    """The slice's pairs ``xs`` (``[block_k // 4, 4]``, four a word) as four
    ``[block_n, block_k // 4]`` operands: byte ``k``'s pair of every word, the same in each row."""
    even, odd = tl.split(tl.reshape(xs, (block_k // 4, 2, 2)))  # pairs 4w + 2i, 4w + 2i + 1
    first, third = tl.split(even)
    second, fourth = tl.split(odd)
    return (
        tl.broadcast_to(first[None, :], (block_n, block_k // 4)),
        tl.broadcast_to(second[None, :], (block_n, block_k // 4)),
        tl.broadcast_to(third[None, :], (block_n, block_k // 4)),
        tl.broadcast_to(fourth[None, :], (block_n, block_k // 4)),
    )


@triton.jit  # type: ignore[untyped-decorator]
def _words_in_registers(  # type: ignore[no-untyped-def]
    codes,
    xs,
    low0,
    low1,
    low2,
    low3,
    high0,
    high1,
    high2,
    high3,
    lookup: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """Each word's sum of its eight codes' values times their activations,
    ``[block_n, block_k // 4]``, by ``lookup`` with the table in registers."""
    x0, x1, x2, x3 = _activations(xs, block_n, block_k)
    # The table words, the same in every element.
    zeros = tl.zeros((block_n, block_k // 4), dtype=tl.int32)
    # fmt: off
    operands = [
        codes, x0, x1, x2, x3,
        zeros + low0, zeros + low1, zeros + low2, zeros + low3,
        zeros + high0, zeros + high1, zeros + high2, zeros + high3,
    ]
    # fmt: on
    return tl.inline_asm_elementwise(
        lookup, _LOOKUP_CONSTRAINTS, operands, dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit  # type: ignore[untyped-decorator]
def _words_from_memory(  # type: ignore[no-untyped-def]
    codes, xs, code_ptr, dtype: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr
):
    """``_words_in_registers``' sums with the table read from memory and summed in float32:
    for Triton's interpreter, which cannot run inline assembly (the tests check the rest of the
    kernel with it; the lookup's own tests run its PTX)."""
    x0, x1, x2, x3 = _activations(xs, block_n, block_k)
    total = _byte_from_memory(codes, 0, x0, code_ptr, dtype)
    total += _byte_from_memory(codes, 1, x1, code_ptr, dtype)
    total += _byte_from_memory(codes, 2, x2, code_ptr, dtype)
    total += _byte_from_memory(codes, 3, x3, code_ptr, dtype)
    return total


@triton.jit  # type: ignore[untyped-decorator]
def _byte_from_memory(codes, k: tl.constexpr, x, code_ptr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """Byte ``k`` of each word's two values (read from the table) times their activations
    ``x`` (the pair of 16-bit values), in float32."""
    byte = (codes >> (8 * k)) & 0xFF
    first = tl.load(code_ptr + (byte >> 4)).to(dtype).to(tl.float32)
    second = tl.load(code_ptr + (byte & 15)).to(dtype).to(tl.float32)
    x_first = (x & 0xFFFF).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
    x_second = ((x >> 16) & 0xFFFF).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
    return first * x_first + second * x_second


@triton.jit  # type: ignore[untyped-decorator]
def four_bit_rows(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    residual_ptr,
    out_ptr,
    m,
    rows_out,
    pairs,
    stride_w,
    stride_m,
    values: tl.constexpr,
    dot: tl.constexpr,
    in_registers: tl.constexpr,
    nested: tl.constexpr,
    group: tl.constexpr,
    block_pairs: tl.constexpr,
    swiglu: tl.constexpr,
    has_residual: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """``four_bit_row`` for ``m`` rows of activations (``[m, pairs]`` pairs, at most
    ``block_m``): each word of codes looked up once (``values``, ``four_bit_lookup.values_asm``)
    and multiplied by every row's activations (``dot``); ``[m, rows_out]`` out."""
    dtype = out_ptr.dtype.element_ty
    low0, low1, low2, low3, high0, high1, high2, high3 = table_words(code_ptr, dtype)
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    ms = tl.arange(0, block_m)
    m_ok = ms < m
    acc = tl.zeros([block_m, block_n, block_k // block_pairs], dtype=tl.float32)
    acc_up = tl.zeros([block_m, block_n, block_k // block_pairs], dtype=tl.float32)
    for start in range(0, pairs, block_k):
        cols = start + 4 * tl.arange(0, block_k // 4)[:, None] + tl.arange(0, 4)[None, :]
        at = x_ptr + ms[:, None, None].to(tl.int64) * pairs + cols[None, :, :]
        xs = tl.load(at, mask=m_ok[:, None, None] & (cols < pairs)[None, :, :], other=0)
        acc += _rows_slice(
            w_ptr, maxima_ptr, code_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr,
            xs, low0, low1, low2, low3, high0, high1, high2, high3, rows, row_ok, start, pairs,
            stride_w, stride_m, values, dot, in_registers, nested, group, dtype, block_pairs,
            block_m, block_n, block_k,
        )  # fmt: skip
        if swiglu:
            acc_up += _rows_slice(
                w_ptr, maxima_ptr, code_ptr, nested_code_ptr, nested_absmax_ptr,
                nested_offset_ptr, xs, low0, low1, low2, low3, high0, high1, high2, high3,
                rows + rows_out, row_ok, start, pairs, stride_w, stride_m, values, dot,
                in_registers, nested, group, dtype, block_pairs, block_m, block_n, block_k,
            )  # fmt: skip
    # The one-row epilogue, elementwise over every row's outputs.
    at = ms[:, None].to(tl.int64) * rows_out + rows[None, :]
    ok = m_ok[:, None] & row_ok[None, :]
    finish_row(
        tl.sum(acc, axis=2), tl.sum(acc_up, axis=2), residual_ptr, out_ptr, at, ok, swiglu,
        has_residual,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]
def _rows_slice(  # type: ignore[no-untyped-def]
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    xs,
    low0,
    low1,
    low2,
    low3,
    high0,
    high1,
    high2,
    high3,
    rows,
    row_ok,
    start,
    pairs,
    stride_w,
    stride_m,
    values: tl.constexpr,
    dot: tl.constexpr,
    in_registers: tl.constexpr,
    nested: tl.constexpr,
    group: tl.constexpr,
    dtype: tl.constexpr,
    block_pairs: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
):
    """One slice of ``four_bit_rows``: ``[block_m, block_n, block_k // block_pairs]`` block
    sums of every row of activations, each scaled by its maximum."""
    codes = _codes(w_ptr, rows, row_ok, start, pairs, stride_w, block_k)
    # Byte k's pair of activations of every word, per row: [block_m, block_k // 4] each.
    even, odd = tl.split(tl.reshape(xs, (block_m, block_k // 4, 2, 2)))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    if in_registers:
        v0, v1, v2, v3 = _pairs_in_registers(
            codes, values, low0, low1, low2, low3, high0, high1, high2, high3
        )
        # fmt: off
        operands = [
            _over_rows(v0, block_m), _over_rows(v1, block_m),
            _over_rows(v2, block_m), _over_rows(v3, block_m),
            _over_codes(x0, block_n), _over_codes(x1, block_n),
            _over_codes(x2, block_n), _over_codes(x3, block_n),
        ]
        # fmt: on
        sums = tl.inline_asm_elementwise(
            dot, _DOT_CONSTRAINTS, operands, dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        wide = _over_rows(codes, block_m)
        sums = _byte_from_memory(wide, 0, _over_codes(x0, block_n), code_ptr, dtype)
        sums += _byte_from_memory(wide, 1, _over_codes(x1, block_n), code_ptr, dtype)
        sums += _byte_from_memory(wide, 2, _over_codes(x2, block_n), code_ptr, dtype)
        sums += _byte_from_memory(wide, 3, _over_codes(x3, block_n), code_ptr, dtype)
    sums = tl.sum(
        tl.reshape(sums, (block_m, block_n, block_k // block_pairs, block_pairs // 4)), axis=3
    )
    maxima = _block_maxima(
        maxima_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr, rows, row_ok, start,
        pairs, stride_m, nested, group, block_pairs, block_k,
    )  # fmt: skip
    return sums * maxima[None, :, :]


@triton.jit  # type: ignore[untyped-decorator]
def _over_rows(words, block_m: tl.constexpr):  # type: ignore[no-untyped-def]
    """``[block_n, W]`` of the codes, the same for each of ``block_m`` rows of activations."""
    return tl.broadcast_to(words[None, :, :], (block_m, words.shape[0], words.shape[1]))


@triton.jit  # type: ignore[untyped-decorator]
def _over_codes(x, block_n: tl.constexpr):  # type: ignore[no-untyped-def]
    """``[block_m, W]`` activations, the same for each of ``block_n`` rows of codes."""
    return tl.broadcast_to(x[:, None, :], (x.shape[0], block_n, x.shape[1]))


@triton.jit  # type: ignore[untyped-decorator]
def four_bit_matmul(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    maxima_ptr,
    code_ptr,
    nested_code_ptr,
    nested_absmax_ptr,
    nested_offset_ptr,
    out_ptr,
    m,
    rows_out,
    pairs,
    stride_w,
    stride_m,
    split_pairs,
    values: tl.constexpr,
    in_registers: tl.constexpr,
    nested: tl.constexpr,
    group: tl.constexpr,
    block_pairs: tl.constexpr,
    slice_pairs: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    splits: tl.constexpr,
):
    """``x @ W.T`` for ``m`` rows of ``x`` (``[m, 2 * pairs]`` 16-bit values) on the tensor
    cores: a program's ``block_n`` rows of codes ``slice_pairs`` bytes at a time, each word's
    eight codes looked up in registers into 16-bit values (``values``,
    ``four_bit_lookup.values_asm``; read from memory where not ``in_registers``) and multiplied
    by ``block_m`` rows of activations (``tl.dot``, float32): no weight is dequantized into
    memory. A slice of one block (``block_pairs`` bytes) multiplies the block's unscaled
    values and scales that product by the block's maximum once, each weight rounded once (as
    the table's 16-bit value); a slice of several scales each value by its block's maximum
    first (rounded again, as bitsandbytes' dequantization rounds it), so that one product
    covers them all. With ``splits`` over 1, program ``(i, j, s)`` covers the ``split_pairs``
    inputs' pairs from ``s * split_pairs`` (a multiple of ``slice_pairs``) and writes its
    float32 sums to ``out_ptr``'s ``s``-th ``[m, rows_out]`` (``[splits, m, rows_out]``), which
    the caller adds: more programs where a weight's few rows would leave the GPU's
    multiprocessors idle, each summing in the same order every time."""
    dtype = x_ptr.dtype.element_ty
    blocks: tl.constexpr = slice_pairs // block_pairs
    low0, low1, low2, low3, high0, high1, high2, high3 = table_words(code_ptr, dtype)
    rows = tl.program_id(0) * block_n + tl.arange(0, block_n)
    row_ok = rows < rows_out
    lines = tl.program_id(1) * block_m + tl.arange(0, block_m)
    line_ok = lines < m
    x_lines = x_ptr + lines.to(tl.int64)[:, None] * (2 * pairs)
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    first = tl.program_id(2) * split_pairs
    for start in range(first, tl.minimum(first + split_pairs, pairs), slice_pairs):
        codes = _codes(w_ptr, rows, row_ok, start, pairs, stride_w, slice_pairs)
        if in_registers:
            v0, v1, v2, v3 = _pairs_in_registers(
                codes, values, low0, low1, low2, low3, high0, high1, high2, high3
            )
        else:
            v0 = _pair_from_memory(codes, 0, code_ptr, dtype)
            v1 = _pair_from_memory(codes, 1, code_ptr, dtype)
            v2 = _pair_from_memory(codes, 2, code_ptr, dtype)
            v3 = _pair_from_memory(codes, 3, code_ptr, dtype)
        weights = _in_order(v0, v1, v2, v3, dtype, block_n, slice_pairs)
        cols = 2 * start + tl.arange(0, 2 * slice_pairs)
        xs = tl.load(
            x_lines + cols[None, :], mask=line_ok[:, None] & (cols < 2 * pairs)[None, :], other=0.0
        )
        maxima = _block_maxima(
            maxima_ptr, nested_code_ptr, nested_absmax_ptr, nested_offset_ptr, rows, row_ok,
            start, pairs, stride_m, nested, group, block_pairs, slice_pairs,
        )  # fmt: skip
        if blocks > 1:
            weights = _scaled(weights, maxima, dtype, block_n, blocks, 2 * block_pairs)
        if not in_registers:
            # Triton's interpreter multiplies bfloat16 tiles as integers; in float32 the
            # products are the same (exact) and summed as the tensor cores sum them.
            xs, weights = xs.to(tl.float32), weights.to(tl.float32)
        if blocks > 1:
            acc = tl.dot(xs, tl.trans(weights), acc)
        else:
            acc += tl.dot(xs, tl.trans(weights)) * tl.reshape(maxima, (1, block_n))
    at = out_ptr + lines.to(tl.int64)[:, None] * rows_out + rows[None, :]
    if splits > 1:
        at = at + tl.program_id(2).to(tl.int64) * m * rows_out
        tl.store(at, acc, mask=line_ok[:, None] & row_ok[None, :])
    else:
        tl.store(at, acc.to(dtype), mask=line_ok[:, None] & row_ok[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _scaled(  # type: ignore[no-untyped-def]
    weights,
    maxima,
    dtype: tl.constexpr,
    block_n: tl.constexpr,
    blocks: tl.constexpr,
    block_inputs: tl.constexpr,
):
    """``[block_n, blocks * block_inputs]`` table values each times its block's maximum
    (``maxima``: ``[block_n, blocks]``, float32), rounded to ``dtype``."""
    by_block = tl.reshape(weights, (block_n, blocks, block_inputs)).to(tl.float32)
    scaled = by_block * tl.reshape(maxima, (block_n, blocks, 1))
    return tl.reshape(scaled.to(dtype), (block_n, blocks * block_inputs))


@triton.jit  # type: ignore[untyped-decorator]
def _pairs_in_registers(  # type: ignore[no-untyped-def]
    codes, values: tl.constexpr, low0, low1, low2, low3, high0, high1, high2, high3
):
    """Each word of ``codes``' four pairs of 16-bit values (``values``, the lookup's PTX),
    the table words the same in every element."""
    zeros = tl.zeros(codes.shape, dtype=tl.int32)
    # fmt: off
    return tl.inline_asm_elementwise(
        values, _VALUES_CONSTRAINTS,
        [codes, zeros + low0, zeros + low1, zeros + low2, zeros + low3, zeros + high0,
         zeros + high1, zeros + high2, zeros + high3],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1,
    )
    # fmt: on


@triton.jit  # type: ignore[untyped-decorator]
def _pair_from_memory(codes, k: tl.constexpr, code_ptr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """``values_asm``'s pair of byte ``k`` of each word, the table read from memory: the high
    code's value in the low half, the low code's in the high half (for Triton's interpreter)."""
    byte = (codes >> (8 * k)) & 0xFF
    first = _sixteen_bits(tl.load(code_ptr + (byte >> 4)), dtype)
    second = _sixteen_bits(tl.load(code_ptr + (byte & 15)), dtype)
    return first | (second << 16)


@triton.jit  # type: ignore[untyped-decorator]
def _in_order(  # type: ignore[no-untyped-def]
    v0, v1, v2, v3, dtype: tl.constexpr, block_n: tl.constexpr, block_pairs: tl.constexpr
):
    """The four pairs of each word (``[block_n, block_pairs // 4]`` each) as
    ``[block_n, 2 * block_pairs]`` values of ``dtype`` in the inputs' order: word ``w``'s byte
    ``k`` holds inputs ``8w + 2k`` (its pair's low half) and ``8w + 2k + 1``."""
    a0 = tl.join(_half(v0, 0, dtype), _half(v0, 16, dtype))  # [n, w, half]
    a1 = tl.join(_half(v1, 0, dtype), _half(v1, 16, dtype))
    a2 = tl.join(_half(v2, 0, dtype), _half(v2, 16, dtype))
    a3 = tl.join(_half(v3, 0, dtype), _half(v3, 16, dtype))
    # [n, w, half, k % 2, k // 2], then the byte's place before the half's.
    joined = tl.join(tl.join(a0, a1), tl.join(a2, a3))
    ordered = tl.permute(joined, (0, 1, 4, 3, 2))
    return tl.reshape(ordered, (block_n, 2 * block_pairs))


@triton.jit  # type: ignore[untyped-decorator]
def _half(pair, shift: tl.constexpr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """The 16-bit value at bit ``shift`` of each 32-bit ``pair``."""
    return ((pair >> shift) & 0xFFFF).to(tl.int16).to(dtype, bitcast=True)
