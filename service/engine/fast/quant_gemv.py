"""Projections of bitsandbytes weights on a GPU (``product``): which kernel multiplies each shape,
and the engine's own Triton kernels among them, which read the packed weights and dequantize
them where they multiply: ``one_row`` for a lone request's int8 decode step and ``four_bit_row``
for its 4-bit one (the codes looked up in registers, ``four_bit_lookup``), ``four_bit_rows`` for
a few rows of 4-bit codes (each word looked up once for all of them), ``rows`` for an int8
batch (a decode step of many rows, a short prefill); and ``dequantized``, the weight once into
16 bits for cuBLAS. ``four_bit_matmul`` (a batch of 4-bit codes looked up in registers into the
tensor cores' operands, each block's product scaled once) takes the batches past those up to
``FOUR_BIT_MATMUL_ROWS``, or ``WIDE_TILE_ROWS`` on a device with the shared memory for its wide
tile (``Linear.wide_tile``).

Compiled by inductor, the same product (``linear.row_product`` over ``linear.dequantize``) looks
each 4-bit code up inside the reduction, far slower than bf16 at one row (docs/benchmarks.md).
The kernels read a program's ``block_n`` output rows in slices of inputs: NF4 (or FP4) codes two
to a byte (the first in the high half), each stood for by one of the format's 16 values times its
block's maximum (float32, or bitsandbytes' 8-bit double quantization: ``nested``); int8 values
each row's times its maximum over 127. ``dequantized`` rounds every weight to the activations'
dtype as bitsandbytes' own dequantization does; the 4-bit kernels sum a block's table values
times their activations and scale the block's sum once, and the int8 ones sum the values as they
are (made floats by a bit trick, not the GPU's slower conversion units) and scale each output
once: each rounds differently from a weight dequantized first, within the dtype's precision.
``gated`` (SwiGLU over the fused gate/up halves) and ``residual`` are fused into the one-row
kernels as in ``gemv.py``; norms never fold into bitsandbytes weights, so there is no norm
option.

Which one runs (``product``), from what the kernels measured side by side (docs/benchmarks.md,
``loadtests/quant_kernels.py``): 4-bit codes cost a table lookup per weight, which held
bitsandbytes' GEMV and the engine's first kernel (a load per lookup) far under the memory's pace;
``four_bit_row``'s lookup is a few byte permutes per four codes in registers, so one 16-bit row of
them takes it (bitsandbytes' own GEMV where it cannot run: float32, no Triton), up to
``FOUR_BIT_ROWS_TAKEN`` rows take ``four_bit_rows``, up to ``matmul_rows``
``four_bit_matmul``, and wider batches dequantize the weight into 16 bits once and take cuBLAS,
as bitsandbytes does; int8 values go
into the tensor cores' product as they are, so ``rows`` keeps int8 batches of up to ``INT8_ROWS``
in its packed bytes (each output scaled by its row's maximum once, which rounds differently from a
weight dequantized first, within float16's precision), and wider ones dequantize too. A weight is
dequantized at most ``SLICE_BYTES`` at a time (the output layer a slice of its rows at a time), so
that what a captured step keeps in its memory pool stays the size of a layer's largest projection
(``dequantized_bytes``, which the engine's memory fit sets aside).
"""

from __future__ import annotations

from typing import Any

import torch

from service.engine.fast.batch_tiles import (
    MatmulConfig,
    four_bit_config,
    four_bit_split,
    matmul_config,
)
from service.engine.fast.four_bit_lookup import dot_asm, lookup_asm, values_asm
from service.engine.fast.gemv import GemvConfig
from service.engine.fast.linear import GROUP, Linear, NestedMaxima

_int8_row_kernel: Any
_int8_rows_kernel: Any
_dequantize_kernel: Any
_maxima_kernel: Any
_four_bit_kernel: Any
_four_bit_rows_kernel: Any
_four_bit_matmul_kernel: Any
try:
    from service.engine.fast.four_bit_kernel import four_bit_matmul as _four_bit_matmul_kernel
    from service.engine.fast.four_bit_kernel import four_bit_row as _four_bit_kernel
    from service.engine.fast.four_bit_kernel import four_bit_rows as _four_bit_rows_kernel
    from service.engine.fast.quant_gemv_kernel import dequantize as _dequantize_kernel
    from service.engine.fast.quant_gemv_kernel import int8_row as _int8_row_kernel
    from service.engine.fast.quant_gemv_kernel import int8_rows as _int8_rows_kernel
    from service.engine.fast.quant_gemv_kernel import nested_maxima as _maxima_kernel
except ImportError:  # no Triton (a CPU build of torch)
    _int8_row_kernel = _int8_rows_kernel = _dequantize_kernel = _maxima_kernel = None
    _four_bit_kernel = _four_bit_rows_kernel = _four_bit_matmul_kernel = None

# int8 batches of more rows than this dequantize the weight once into the activations' dtype and
# take cuBLAS: a wider batch reads the weight again per tile of 128 batch rows. Up to it, with
# the grid narrowed to enough programs (``matmul_config``), ``rows`` measured faster than the
# dequantized product (docs/benchmarks.md, run 92); 128 is also the most rows a 16 GiB int8
# engine runs at once.
INT8_ROWS = 128
# The most of a weight dequantized at once, in bytes of 16 bits: a wider one (the output layer's
# 128,256 rows) is multiplied a slice of its rows at a time.
SLICE_BYTES = 256 * 2**20


# Block sizes as ``gemv.py``'s (``block_k``: inputs per slice, raised to the 4-bit block).
DEFAULT = GemvConfig(block_n=4, block_k=1024, warps=4, stages=2)
# ``four_bit_row``'s: four warps of 32 lanes read a row's slice of 1,024 inputs (512 bytes) as
# 16 bytes a lane, each warp its row.
FOUR_BIT_DEFAULT = GemvConfig(block_n=4, block_k=1024, warps=4, stages=3)
# ``four_bit_rows``': slices of 512 inputs, each looked-up word multiplied by up to
# ``FOUR_BIT_ROWS`` rows of activations.
FOUR_BIT_ROWS_DEFAULT = GemvConfig(block_n=4, block_k=512, warps=4, stages=2)
FOUR_BIT_ROWS = 16
# The most rows of 4-bit codes ``product`` gives ``four_bit_rows``: its time grows with the rows
# (each row's products cost as much as the lookup they share), while the split tensor-core
# product takes about as long at 2-16 rows as at one, so one row only: a lone request's, fused
# with its SwiGLU and residual (docs/benchmarks.md, runs 117, 136 and 137).
FOUR_BIT_ROWS_TAKEN = 1
# The most rows of 4-bit codes past ``FOUR_BIT_ROWS_TAKEN`` that ``product`` gives
# ``four_bit_matmul`` (0: none): up to 64 rows its lookup, once a weight for a tile of rows,
# costs less than writing and reading the dequantized weight (docs/benchmarks.md, runs 120-121).
FOUR_BIT_MATMUL_ROWS = 64
# Up to 128 rows ``batch_tiles.WIDE_TILE`` does too (run 127), for weights marked
# ``wide_tile``: its 131,072 bytes of shared memory on compute capability 7.5 pass a T4's 64 KiB
# (93,184 on 8.x), so the device's capability decides (``Capability.wide_four_bit``;
# tests/engine/test_kernels_compile.py checks the small cards' tiles).
WIDE_TILE_ROWS = 128
# Whether ``four_bit_matmul`` reads double-quantized maxima dequantized first by one kernel a
# layer (``_maxima``, into the layer's shared buffer) rather than each where its block is
# multiplied (a gather in the loop, which the pipeliner leaves unhidden: slower the more rows a
# program's codes serve, docs/benchmarks.md, run 120).
FOUR_BIT_MATMUL_FLOAT_MAXIMA = True
# The programs ``four_bit_matmul`` splits a 4-bit batch product's inputs to reach
# (``batch_tiles.four_bit_split``; 0: none): a layer's products took less time split this way
# at 1 to 64 rows, and the wide tile's 65-128 rows are left whole (docs/benchmarks.md, run 136).
FOUR_BIT_SPLIT_PROGRAMS = 512


def runs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether one row of ``dtype`` on ``device`` takes the kernel: 16-bit on CUDA, Triton
    present."""
    cuda = device.type == "cuda"
    return cuda and dtype in (torch.bfloat16, torch.float16) and _int8_row_kernel is not None


def available(x: torch.Tensor) -> bool:
    return runs(x.dtype, x.device)


def one_row(
    x: torch.Tensor,
    p: Linear,
    *,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``x @ W.T`` (``x``: ``[1, K]``) for the bitsandbytes weight ``p``, or ``silu(gate) * up``
    of its two halves when ``gated``, plus ``residual`` when given; ``[1, N]`` in ``x``'s
    dtype: int8 rows by the one-row kernel, 4-bit codes by ``four_bit_row`` (where
    ``four_bit_row_runs``)."""
    if p.code is not None:
        assert four_bit_row_runs(x, p), "4-bit codes the row kernel reads"
        return four_bit_row(x, p, gated=gated, residual=residual, config=config)
    assert p.scale is not None, "int8 rows have their maxima"
    chosen = config or DEFAULT
    total = p.weight.shape[0]
    outputs = total // 2 if gated else total
    out = torch.empty(1, outputs, dtype=x.dtype, device=x.device)
    _int8_row_kernel[(-(-outputs // chosen.block_n),)](
        x, p.weight, p.scale, x if residual is None else residual, out, outputs, x.shape[-1],
        p.weight.stride(0), swiglu=gated, has_residual=residual is not None,
        block_n=chosen.block_n, block_k=chosen.block_k, num_warps=chosen.warps,
        num_stages=chosen.stages,
    )  # fmt: skip
    return out


def few_rows_run(x: torch.Tensor, p: Linear) -> bool:
    """Whether ``few_rows`` multiplies ``x`` by ``p``: one 16-bit row on CUDA of int8 weights,
    or up to ``FOUR_BIT_ROWS_TAKEN`` rows of 4-bit codes where ``four_bit_row_runs``."""
    if not (p.bitsandbytes and available(x)):
        return False
    if p.code is None:
        return x.shape[0] == 1
    return x.shape[0] <= FOUR_BIT_ROWS_TAKEN and four_bit_row_runs(x, p)


def few_rows(
    x: torch.Tensor, p: Linear, *, gated: bool = False, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T`` (or SwiGLU of its halves when ``gated``, plus ``residual``) where
    ``few_rows_run``: ``one_row`` for one row, ``four_bit_rows`` for more."""
    if x.shape[0] == 1:
        return one_row(x, p, gated=gated, residual=residual)
    return four_bit_rows(x, p, gated=gated, residual=residual)


def four_bit_row_runs(x: torch.Tensor, p: Linear) -> bool:
    """Whether ``four_bit_row`` multiplies the row ``x`` by the 4-bit weight ``p``: 16-bit on
    CUDA with Triton, whole words of codes (eight inputs, their rows and first byte at a 4-byte
    boundary) and blocks of a multiple of eight inputs."""
    if p.code is None or p.scale is None or _four_bit_kernel is None:
        return False
    inputs, blocks = x.shape[-1], p.scale.shape[1]
    whole = inputs % 8 == 0 and inputs % blocks == 0 and (inputs // blocks) % 8 == 0
    # A compiled step cannot ask a tensor's offset (dynamo traces no call that returns an int);
    # there the engine's codes are tensors of their own, and the words' view in ``four_bit_row``
    # refuses a misaligned one while the step is traced.
    aligned = torch.compiler.is_compiling() or p.weight.storage_offset() % 4 == 0
    words = p.weight.stride(0) % 4 == 0 and aligned
    sixteen_bits = x.dtype in (torch.float16, torch.bfloat16)
    return whole and words and p.weight.stride(1) == 1 and sixteen_bits and available(x)


def four_bit_row(
    x: torch.Tensor,
    p: Linear,
    *,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    in_registers: bool = True,
) -> torch.Tensor:
    """``one_row`` for 4-bit codes: each byte's two codes looked up in registers
    (``four_bit_lookup``), each block's sum scaled by its maximum once (nested maxima read in
    their 8-bit form). Not ``in_registers``: the table read from memory, for Triton's
    interpreter (the tests)."""
    chosen = config or FOUR_BIT_DEFAULT
    tensors, sizes, flags = _four_bit_arguments(x, p, gated, residual, chosen, in_registers)
    out = torch.empty(1, sizes[0], dtype=x.dtype, device=x.device)
    _four_bit_kernel[(-(-sizes[0] // chosen.block_n),)](
        *tensors, out, *sizes, lookup=lookup_asm(x.dtype), **flags
    )
    return out


def four_bit_rows(
    x: torch.Tensor,
    p: Linear,
    *,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    in_registers: bool = True,
) -> torch.Tensor:
    """``four_bit_row`` for up to ``FOUR_BIT_ROWS`` rows ``x`` (``[m, K]``): each word of codes
    looked up once for every row."""
    m = x.shape[0]
    assert m <= FOUR_BIT_ROWS, f"at most {FOUR_BIT_ROWS} rows, not {m}"
    chosen = config or FOUR_BIT_ROWS_DEFAULT
    tensors, sizes, flags = _four_bit_arguments(x, p, gated, residual, chosen, in_registers)
    out = torch.empty(m, sizes[0], dtype=x.dtype, device=x.device)
    _four_bit_rows_kernel[(-(-sizes[0] // chosen.block_n),)](
        *tensors, out, m, *sizes, values=values_asm(), dot=dot_asm(x.dtype),
        block_m=max(2, 1 << (m - 1).bit_length()), **flags,
    )  # fmt: skip
    return out


def _four_bit_arguments(
    x: torch.Tensor,
    p: Linear,
    gated: bool,
    residual: torch.Tensor | None,
    config: GemvConfig,
    in_registers: bool,
) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...], dict[str, Any]]:
    """What ``four_bit_row`` and ``four_bit_rows`` launch with: the tensors (activations and
    codes as 32-bit words, maxima, tables, the residual), the sizes (outputs, pairs of
    inputs, the strides of codes and maxima) and the ``constexpr`` flags."""
    total = p.weight.shape[0]
    weight, weight_flags = _four_bit_weight(p, x.shape[-1], in_registers)
    tensors = (
        x.contiguous().view(torch.int32),
        *weight,
        x if residual is None else residual.contiguous(),
    )
    pairs, block_pairs = x.shape[-1] // 2, weight_flags["block_pairs"]
    sizes = (total // 2 if gated else total, pairs, p.weight.stride(0) // 4, pairs // block_pairs)
    flags = weight_flags | {
        "swiglu": gated,
        "has_residual": residual is not None,
        "block_n": config.block_n,
        "block_k": max(config.block_k // 2, block_pairs),
        "num_warps": config.warps,
        "num_stages": config.stages,
    }
    return tensors, sizes, flags


def _four_bit_weight(
    p: Linear, inputs: int, in_registers: bool
) -> tuple[tuple[torch.Tensor, ...], dict[str, int]]:
    """The 4-bit kernels' weight arguments: the codes as 32-bit words, the maxima, the table
    and the nested maxima's code, scales and offsets; and their ``constexpr`` flags."""
    assert p.scale is not None, "a 4-bit weight has its maxima"
    assert p.code is not None, "a 4-bit weight has its table"
    nested = p.nested
    # Nested maxima are read as they are kept (a byte each, their groups' scale and offset
    # from the cache), not dequantized into float32 first: a quarter of the bytes.
    maxima = p.scale if nested is not None else p.scale.reshape(-1)
    tensors = (
        p.weight.view(torch.int32),  # four bytes of codes a word
        maxima,
        p.code,
        p.scale if nested is None else nested.code,
        p.scale if nested is None else nested.absmax,
        p.scale if nested is None else nested.offset,
    )
    flags = {
        "in_registers": int(in_registers),
        "nested": int(nested is not None),
        "group": GROUP,
        "block_pairs": inputs // p.scale.shape[1] // 2,
    }
    return tensors, flags


def four_bit_matmul(
    x: torch.Tensor,
    p: Linear,
    config: MatmulConfig | None = None,
    in_registers: bool = True,
    float_maxima: bool = False,
    split_programs: int | None = None,
) -> torch.Tensor:
    """``x @ W.T`` (``x``: ``[M, K]``, 16-bit) for the 4-bit codes ``p`` on the tensor cores,
    each slice of codes looked up in registers (``four_bit_kernel.four_bit_matmul``;
    ``config``'s ``block_k``: inputs a slice, at least the weight's block, whose product is
    then scaled by the block's maximum once; ``four_bit_config``'s by default);
    ``float_maxima``: nested maxima dequantized first (``_maxima``); ``config.splits``:
    programs over the inputs, their float32 sums added after (``four_bit_split`` to
    ``split_programs`` where no ``config`` is given; None: ``FOUR_BIT_SPLIT_PROGRAMS``). Not
    ``in_registers``: the table read from memory, for Triton's interpreter (the tests)."""
    if float_maxima and p.nested is not None and p.scale is not None:
        p = Linear(p.weight, _maxima(p).view(p.scale.shape), p.code)
    batch, inputs = x.shape
    outputs = p.weight.shape[0]
    tensors, flags = _four_bit_weight(p, inputs, in_registers)
    chosen = config or four_bit_config(batch, outputs)
    block_pairs = int(flags["block_pairs"])
    slice_pairs = max(block_pairs, chosen.block_k // 2)
    pairs = inputs // 2
    slices = -(-pairs // slice_pairs)
    programs = FOUR_BIT_SPLIT_PROGRAMS if split_programs is None else split_programs
    if config is None and programs:
        chosen = four_bit_split(chosen, batch, outputs, slices, programs)
    # Each split's pairs a whole number of slices, so that no slice straddles two programs.
    split_pairs = -(-slices // chosen.splits) * slice_pairs
    splits = -(-pairs // split_pairs)
    shape = (batch, outputs) if splits == 1 else (splits, batch, outputs)
    out = torch.empty(shape, dtype=x.dtype if splits == 1 else torch.float32, device=x.device)
    grid = (-(-outputs // chosen.block_n), -(-batch // chosen.block_m), splits)
    _four_bit_matmul_kernel[grid](
        x.contiguous(), *tensors, out, batch, outputs, pairs, p.weight.stride(0) // 4,
        pairs // block_pairs, split_pairs, values=values_asm(), block_m=chosen.block_m,
        block_n=chosen.block_n, slice_pairs=slice_pairs, splits=splits,
        num_warps=chosen.warps, num_stages=chosen.stages, **flags,
    )  # fmt: skip
    return out if splits == 1 else out.sum(0).to(x.dtype)


def _format(p: Linear, inputs: int) -> tuple[tuple[torch.Tensor, ...], dict[str, int | bool]]:
    """The weight's tensors as ``dequantize`` takes them (the codes, their maxima, the code table,
    the nested maxima's table, scales and offsets; an unused one stands in as the maxima, never
    read: its flag is off), and the format's flags."""
    scale, nested = p.scale, p.nested
    assert scale is not None, "a bitsandbytes weight has its scales"
    four_bit = p.code is not None
    tensors = (
        p.weight,
        scale,
        scale if p.code is None else p.code,
        scale if nested is None else nested.code,
        scale if nested is None else nested.absmax,
        scale if nested is None else nested.offset,
    )
    flags: dict[str, int | bool] = {
        "four_bit": four_bit,
        "nested": nested is not None,
        "block": inputs // scale.shape[1] if four_bit else 1,  # inputs per 4-bit maximum
        "group": GROUP,
    }
    return tensors, flags


def _strides(p: Linear) -> tuple[int, int]:
    """The rows' strides of the codes and of their maxima."""
    assert p.scale is not None
    return p.weight.stride(0), p.scale.stride(0)


def _slice(block_k: int, flags: dict[str, int | bool]) -> int:
    """Inputs per slice: at least a 4-bit block, whose maximum a slice reads once."""
    return max(block_k, int(flags["block"])) if flags["four_bit"] else block_k


def rows(x: torch.Tensor, p: Linear, config: MatmulConfig | None = None) -> torch.Tensor:
    """``x @ W.T`` (``x``: ``[M, K]``) for the int8 weight ``p``; ``[M, N]`` in ``x``'s
    dtype."""
    assert p.code is None, "int8 rows"
    assert p.scale is not None, "int8 rows have their maxima"
    batch, inputs = x.shape
    outputs = p.weight.shape[0]
    chosen = config or matmul_config(batch, outputs)
    x = x.contiguous()
    out = torch.empty(batch, outputs, dtype=x.dtype, device=x.device)
    grid = (-(-outputs // chosen.block_n), -(-batch // chosen.block_m))
    _int8_rows_kernel[grid](
        x, p.weight, p.scale, out, batch, outputs, inputs, x.stride(0), p.weight.stride(0),
        block_m=chosen.block_m, block_n=chosen.block_n, block_k=chosen.block_k,
        num_warps=chosen.warps, num_stages=chosen.stages,
    )  # fmt: skip
    return out


def dequantized(
    p: Linear, dtype: torch.dtype, block_n: int = 32, block_k: int = 256
) -> torch.Tensor:
    """The bitsandbytes weight ``p`` as ``[out, in]`` values of ``dtype``, each rounded as
    bitsandbytes' dequantization rounds it (``linear.dequantize``'s numbers, written once by a
    kernel, without its float32 temporaries)."""
    outputs = p.weight.shape[0]
    inputs = p.weight.shape[1] * (2 if p.code is not None else 1)
    tensors, flags = _format(p, inputs)
    out = torch.empty(outputs, inputs, dtype=dtype, device=p.weight.device)
    slice_k = _slice(block_k, flags)
    grid = (-(-outputs // block_n), -(-inputs // slice_k))
    _dequantize_kernel[grid](
        *tensors, out, outputs, inputs, *_strides(p), **flags, block_n=block_n, block_k=slice_k
    )
    return out


def product(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """``x @ W.T`` (``x``: ``[M, K]``) for the bitsandbytes weight ``p`` on a GPU, by the kernel
    that multiplies this shape fastest (the module's docstring says which)."""
    batch = x.shape[0]
    if p.code is not None:
        if batch <= FOUR_BIT_ROWS_TAKEN and four_bit_row_runs(x, p):
            return few_rows(x, p)
        if batch <= matmul_rows(p) and four_bit_row_runs(x, p):
            return four_bit_matmul(x, p, float_maxima=FOUR_BIT_MATMUL_FLOAT_MAXIMA)
        return _bitsandbytes_row(x, p) if batch == 1 else dequantized_product(x, p)
    return dequantized_product(x, p) if batch > INT8_ROWS else rows(x, p)


def matmul_rows(p: Linear) -> int:
    """The most rows of the 4-bit codes ``p`` that ``product`` gives ``four_bit_matmul``."""
    return WIDE_TILE_ROWS if p.wide_tile and FOUR_BIT_MATMUL_ROWS else FOUR_BIT_MATMUL_ROWS


def branches(p: Linear) -> tuple[int, ...]:
    """The row counts past which ``product`` takes another kernel, or another compiled tile,
    for ``p``: 4-bit codes past ``FOUR_BIT_ROWS_TAKEN``, ``FOUR_BIT_MATMUL_ROWS`` and, marked
    ``wide_tile``, ``WIDE_TILE_ROWS`` (where ``four_bit_row_runs``; every batch dequantizes
    elsewhere), int8 past one row and ``INT8_ROWS``; none for weights of other formats."""
    if not p.bitsandbytes:
        return ()
    if p.code is None:
        return (1, INT8_ROWS)
    return tuple(sorted({1, FOUR_BIT_ROWS_TAKEN, FOUR_BIT_MATMUL_ROWS, matmul_rows(p)} - {0}))


def _bitsandbytes_row(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """One row times the 4-bit weight ``p`` by bitsandbytes' own GEMV: the codes' bytes as it
    stores them, each block's float32 maximum (the nested ones dequantized first, as its
    ``gemv_4bit`` does at every call) and the format's 16 values."""
    assert p.scale is not None, "a 4-bit weight has its maxima"
    assert p.code is not None, "a 4-bit weight has its table"
    outputs, inputs = p.weight.shape[0], x.shape[-1]
    block = inputs // p.scale.shape[1]
    # The kernel reads the row from its pointer on: it must be dense.
    return _gemv_4bit(x.contiguous(), p.weight, [outputs, inputs], _maxima(p), p.code, block)


def _gemv_4bit(
    x: torch.Tensor,
    codes: torch.Tensor,
    shape: list[int],
    maxima: torch.Tensor,
    table: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """bitsandbytes' registered operator (there once bitsandbytes is imported, as it is wherever
    its weights were loaded)."""
    out: torch.Tensor = torch.ops.bitsandbytes.gemv_4bit.default(
        x, codes, shape, maxima, table, block
    )
    return out


def _maxima(p: Linear) -> torch.Tensor:
    """The 4-bit weight's block maxima as float32 in row-major order: the nested ones in one
    kernel where Triton is (``NestedMaxima.maxima``'s gather and arithmetic, four kernels and
    an int64 index per maximum, took most of a one-row product's time), with the rest of its
    layer's where they lie side by side (``linear.LayerMaxima``: written by the layer's first
    projection, read by the others)."""
    assert p.scale is not None
    nested = p.nested
    if nested is None:
        return p.scale.reshape(-1)
    shared = p.maxima
    if shared is None:
        return _nested_maxima(p.scale.reshape(-1), nested)
    layer = shared.layer
    if shared.first:
        _nested_maxima(layer.quantized, layer.nested, layer.out)
    return layer.out[shared.start : shared.start + shared.count]


def _nested_maxima(
    quantized: torch.Tensor, nested: NestedMaxima, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The float32 maxima the 8-bit codes ``quantized`` (flat) stand for, written from the
    start of ``out`` where given."""
    count = quantized.numel()
    if _maxima_kernel is None:
        values = nested.maxima(quantized)
        return values if out is None else out[:count].copy_(values)
    out = torch.empty(count, dtype=torch.float32, device=quantized.device) if out is None else out
    _maxima_kernel[(-(-count // _MAXIMA_BLOCK),)](
        quantized, nested.code, nested.absmax, nested.offset, out, count,
        group=GROUP, block=_MAXIMA_BLOCK,
    )  # fmt: skip
    return out[:count]


# Maxima per program of the nested maxima's kernel.
_MAXIMA_BLOCK = 1024


def dequantized_product(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """``x @ W.T`` with the weight dequantized into ``x``'s dtype for cuBLAS, ``SLICE_BYTES`` of
    it at a time."""
    outputs, inputs = p.weight.shape[0], x.shape[-1]
    step = _slice_rows(inputs, x.element_size())
    if outputs <= step:
        return torch.nn.functional.linear(x, dequantized(p, x.dtype))
    parts = [
        torch.nn.functional.linear(x, dequantized(_rows_of(p, first, step), x.dtype))
        for first in range(0, outputs, step)
    ]
    return torch.cat(parts, dim=-1)


def _slice_rows(inputs: int, element_size: int) -> int:
    """Weight rows per slice: ``SLICE_BYTES`` of them, in whole groups of nested maxima (so
    that a slice's groups are a slice of the weight's)."""
    return max(GROUP, SLICE_BYTES // (inputs * element_size) // GROUP * GROUP)


def _rows_of(p: Linear, first: int, count: int) -> Linear:
    """Rows ``first`` to ``first + count`` of ``p`` (views; ``first`` a multiple of ``GROUP``
    rows, whose maxima fill whole groups)."""
    assert p.scale is not None
    end = first + count
    nested = p.nested
    if nested is not None:
        blocks = p.scale.shape[1]
        groups = slice(first * blocks // GROUP, -(-end * blocks // GROUP))
        nested = NestedMaxima(nested.code, nested.absmax[groups], nested.offset[groups])
    return Linear(p.weight[first:end], p.scale[first:end], p.code, nested)


def dequantized_bytes(projections: list[Linear], dtype: torch.dtype) -> int:
    """The most ``product`` writes at once dequantizing any of ``projections`` (bitsandbytes
    weights only) into ``dtype``: what a step's memory pool keeps for it."""
    size = dtype.itemsize
    largest = 0
    for p in projections:
        if p.bitsandbytes:
            inputs = p.weight.shape[1] * (2 if p.code is not None else 1)
            rows_at_once = min(p.weight.shape[0], _slice_rows(inputs, size))
            largest = max(largest, rows_at_once * inputs * size)
    return largest
