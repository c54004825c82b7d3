"""Projections of bitsandbytes weights by Triton kernels of the engine's own, which read the
packed weights and dequantize them where they multiply: ``one_row`` for a lone request's decode
step, ``rows`` for a batch (a decode step of many rows, a short prefill); and ``dequantized``,
the weight once into 16 bits for cuBLAS, for a prefill's chunk wider than any decode step.

Compiled by inductor, the same product (``linear.row_product`` over ``linear.dequantize``) looks
each 4-bit code up inside the reduction, and at one row it measured three times slower than bf16
on an H100 (docs/benchmarks.md, run 62). This kernel reads a program's ``block_n`` output rows in
slices of ``block_k`` inputs: for NF4 (or FP4) the packed codes (two to a byte, the first in the
high half), looked up in the format's 16 values and multiplied by their block's maximum (float32,
or bitsandbytes' 8-bit double quantization: ``nested``); for int8 each row's values times its
maximum over 127. Every weight is rounded to the activations' dtype as bitsandbytes' own
dequantization rounds it, so the product is the one ``dequantize`` then a 16-bit product gives,
summed in float32. ``gated`` (SwiGLU over the fused gate/up halves) and ``residual`` are fused as
in ``gemv.py``; norms never fold into bitsandbytes weights, so there is no norm option.

Dequantized whole before a cuBLAS product, a batch wrote and read every layer's weights in 16 bits
at every step (more bytes than bf16 weights, plus the float32 temporaries of the dequantization)
and a 16 GiB card ran out of memory capturing the output layer's step. ``rows`` dequantizes a
slice of ``block_n`` weight rows at a time in registers, straight into the tensor cores' product
with ``block_m`` rows of the batch: the weights are read in their packed bytes once per
``block_m`` rows, and nothing the size of a weight is ever written. Its int8 values go into the
product as they are (exact in 16 bits) and each output is scaled by its row's maximum once,
which rounds differently from a weight dequantized first, within float16's precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from service.engine.fast.gemv import GemvConfig
from service.engine.fast.linear import GROUP, Linear

_kernel: Any
_batch_kernel: Any
_dequantize_kernel: Any
try:
    from service.engine.fast.quant_gemv_kernel import dequantize as _dequantize_kernel
    from service.engine.fast.quant_gemv_kernel import quant_gemv as _kernel
    from service.engine.fast.quant_gemv_kernel import quant_matmul as _batch_kernel
except ImportError:  # no Triton (a CPU build of torch)
    _kernel = _batch_kernel = _dequantize_kernel = None

# Batches of more rows than this (a prefill's chunk; never a decode step, whose buckets stop at
# 1,024 and whose CUDA graphs would hold the dequantized weight) dequantize the whole weight
# once into the activations' dtype and take cuBLAS: each of ``rows``'s tiles of the batch
# dequantizes the weight again, which a wide batch repeats more times than one write and one
# read of the 16-bit weight cost.
DEQUANTIZE_ABOVE = 1024


# Block sizes as ``gemv.py``'s (``block_k``: inputs per slice, raised to the 4-bit block).
DEFAULT = GemvConfig(block_n=4, block_k=1024, warps=4, stages=2)


def runs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether one row of ``dtype`` on ``device`` takes the kernel: 16-bit on CUDA, Triton
    present."""
    cuda = device.type == "cuda"
    return cuda and dtype in (torch.bfloat16, torch.float16) and _kernel is not None


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
    dtype."""
    chosen = config or DEFAULT
    total = p.weight.shape[0]
    outputs = total // 2 if gated else total
    inputs = x.shape[-1]
    tensors, flags = _format(p, inputs)
    out = torch.empty(1, outputs, dtype=x.dtype, device=x.device)
    _kernel[(-(-outputs // chosen.block_n),)](
        x,
        *tensors,
        x if residual is None else residual,
        out,
        outputs,
        inputs,
        *_strides(p),
        **flags,
        swiglu=gated,
        has_residual=residual is not None,
        block_n=chosen.block_n,
        block_k=_slice(chosen.block_k, flags),
        num_warps=chosen.warps,
        num_stages=chosen.stages,
    )
    return out


def _format(p: Linear, inputs: int) -> tuple[tuple[torch.Tensor, ...], dict[str, int | bool]]:
    """The weight's tensors as both kernels take them (the codes, their maxima, the code table,
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


@dataclass(frozen=True, slots=True)
class MatmulConfig:
    """``rows``'s tiles: batch rows, weight rows and inputs per program and slice."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


def matmul_config(batch: int) -> MatmulConfig:
    """Tiles for a batch of ``batch`` rows: as few padded rows as the tensor cores allow (16)
    for a decode step, wider tiles that dequantize each slice for more rows as the batch grows."""
    if batch <= 16:
        return MatmulConfig(16, 64, 128, 4, 3)
    if batch <= 32:
        return MatmulConfig(32, 64, 128, 4, 3)
    if batch <= 64:
        return MatmulConfig(64, 64, 128, 4, 3)
    return MatmulConfig(128, 128, 64, 8, 3)


def rows(x: torch.Tensor, p: Linear, config: MatmulConfig | None = None) -> torch.Tensor:
    """``x @ W.T`` (``x``: ``[M, K]``, contiguous rows) for the bitsandbytes weight ``p``;
    ``[M, N]`` in ``x``'s dtype."""
    batch, inputs = x.shape
    chosen = config or matmul_config(batch)
    outputs = p.weight.shape[0]
    tensors, flags = _format(p, inputs)
    x = x.contiguous()
    out = torch.empty(batch, outputs, dtype=x.dtype, device=x.device)
    grid = (-(-outputs // chosen.block_n), -(-batch // chosen.block_m))
    _batch_kernel[grid](
        x,
        *tensors,
        out,
        batch,
        outputs,
        inputs,
        x.stride(0),
        *_strides(p),
        **flags,
        block_m=chosen.block_m,
        block_n=chosen.block_n,
        block_k=_slice(chosen.block_k, flags),
        num_warps=chosen.warps,
        num_stages=chosen.stages,
    )
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
