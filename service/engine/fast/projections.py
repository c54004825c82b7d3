"""The projections of a layer as the forward pass calls them: which kernel computes each one.

A single row on the GPU (a lone request's decode step) takes one of the engine's own one-row
kernels with the SwiGLU after gate/up and the residual add after a projection fused in: 16-bit
and FP8 weights ``gemv.py``'s, bitsandbytes' int8 weights ``quant_gemv.py``'s; 4-bit codes take
``quant_gemv.py``'s for up to ``quant_gemv.FOUR_BIT_ROWS_TAKEN`` rows (a decode step of a few).
Every other shape (prefill, batches, a CPU, float32) takes ``product`` (bitsandbytes' formats on
CUDA by ``quant_gemv.product``, which picks the kernel for the shape; else ``linear``: cuBLAS,
``_scaled_mm`` for FP8, bitsandbytes' formats dequantized first) with the same operations
written out around it, as transformers runs them; rows of FP8 weights on a GPU have their
SwiGLU cast for the down projection by the engine's own kernel (``gated_down``, ``swiglu_fp8.py``).
"""

from __future__ import annotations

import torch

from service.engine.fast import gemv, quant_gemv, swiglu_fp8
from service.engine.fast.linear import Linear, linear, scaled_product


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """transformers' RMSNorm; without ``weight`` when it is folded into the next projection."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return h.to(dtype) if weight is None else weight * h.to(dtype)


def _one_row(x: torch.Tensor, p: Linear) -> bool:
    """Whether ``gemv.py``'s kernel computes ``x @ p.T``: one row of 16-bit or FP8 weights."""
    return x.shape[0] == 1 and not p.bitsandbytes and gemv.available(x)


def _few_quantized_rows(x: torch.Tensor, p: Linear, norm_eps: float | None) -> bool:
    """Whether ``quant_gemv.few_rows`` computes it, with the SwiGLU and residual fused in: one
    row of bitsandbytes' int8 weights, or a few of 4-bit codes (``quant_gemv.few_rows_run``);
    norms never fold into these weights."""
    return norm_eps is None and quant_gemv.few_rows_run(x, p)


def project(
    x: torch.Tensor,
    p: Linear,
    residual: torch.Tensor | None = None,
    norm_eps: float | None = None,
    norm_sum: torch.Tensor | None = None,
    sum_into: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``x @ p.T``, plus ``residual`` when given; with ``norm_eps``, of ``x`` RMS-normalised
    first (the norm's weight folded into ``p``). ``norm_sum``, ``sum_into``, ``zero`` and
    ``pdl`` are the one-row kernel's (``gemv.one_row``); other shapes do without them."""
    if _few_quantized_rows(x, p, norm_eps):
        return quant_gemv.few_rows(x, p, residual=residual)
    if _one_row(x, p):
        return gemv.one_row(
            x,
            p.weight,
            p.scale,
            residual=residual,
            norm_eps=norm_eps,
            norm_sum=norm_sum,
            sum_into=sum_into,
            zero=zero,
            pdl=pdl,
        )
    h = x if norm_eps is None else rms_norm(x, None, norm_eps)
    out = product(h, p)
    return out if residual is None else residual + out


def gated_product(
    x: torch.Tensor,
    gate_up: Linear,
    norm_eps: float | None = None,
    norm_sum: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``silu(gate) * up`` of the fused gate/up projection of ``x`` (RMS-normalised first with
    ``norm_eps``, and ``norm_sum`` and ``pdl`` on one row, as ``project``)."""
    if _few_quantized_rows(x, gate_up, norm_eps):
        return quant_gemv.few_rows(x, gate_up, gated=True)
    if _one_row(x, gate_up):
        return gemv.one_row(
            x,
            gate_up.weight,
            gate_up.scale,
            gated=True,
            norm_eps=norm_eps,
            norm_sum=norm_sum,
            pdl=pdl,
        )
    h = x if norm_eps is None else rms_norm(x, None, norm_eps)
    return swiglu(product(h, gate_up))


def gated_down(
    x: torch.Tensor,
    gate_up: Linear,
    down: Linear,
    residual: torch.Tensor,
    norm_eps: float | None = None,
) -> torch.Tensor:
    """``down`` of ``gated_product(x, gate_up, norm_eps)``, plus ``residual``, for rows of FP8
    weights on a GPU (``swiglu_fp8.runs``): the activation scaled and cast to FP8 for ``down`` by
    the engine's own kernel, in one pass over the gate/up product."""
    assert down.scale is not None, "an FP8 weight has its scales"
    h = x if norm_eps is None else rms_norm(x, None, norm_eps)
    values, scales = swiglu_fp8.quantized(product(h, gate_up))
    rows = x.shape[0]
    out = scaled_product(values, scales, down.weight, down.scale, x.dtype, rows, down.fast_accum)
    return residual + out


def product(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """``x @ p.T`` for any number of rows: bitsandbytes weights by ``quant_gemv.product`` where
    its kernels run (16-bit rows on CUDA), everything else by ``linear``."""
    if p.bitsandbytes and quant_gemv.available(x):
        return quant_gemv.product(x, p)
    return linear(x, p.weight, p.scale, p.code, p.nested, p.fast_accum)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused gate/up product (its two halves)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
