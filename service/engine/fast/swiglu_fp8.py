"""An FP8 MLP's activation as one kernel of the engine's own: ``silu(gate) * up`` of the fused
gate/up product, scaled and cast to FP8 for the down projection, a row at a time.

In a batch of FP8 weights the down projection's input is the SwiGLU of the gate/up product,
which ``linear.fp8_linear`` then scales per row (its absolute maximum) and casts to e4m3.
Compiled, inductor reads the gate/up product (twice the intermediate width, in the model's
dtype) in three passes for that: the activation and its maximum, the scale, the cast. Here a
program holds one row's whole activation and does all of it in one pass: the product read once,
the FP8 row and its scale written (``runs`` says where the engine takes it; elsewhere the torch
code does the same in its steps).

The kernel is in ``swiglu_fp8_kernel.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from service.engine.fast.linear import FP8, FP8_MAX, Linear

# Bound at import, as ``rope`` binds its kernel.
_kernel: Any
try:
    from service.engine.fast.swiglu_fp8_kernel import swiglu_fp8 as _kernel
except ImportError:  # no Triton (a CPU build of torch)
    _kernel = None

# ``_scaled_mm`` takes row counts in multiples of this (``linear.fp8_linear`` pads to it).
_ROWS_MULTIPLE = 16


def runs(x: torch.Tensor, down: Linear) -> bool:
    """Whether the engine takes the kernel for ``x``'s rows into the down projection ``down``:
    FP8 weights on CUDA with Triton present, more than one row (a lone row takes the one-row
    kernel, which multiplies unquantized activations)."""
    fp8 = down.scale is not None and down.weight.dtype == FP8
    return _kernel is not None and x.is_cuda and x.shape[0] > 1 and fp8


def quantized(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of each row of ``gate_up`` (``[rows, 2 * inter]``, gate first) as
    e4m3 and each row's float32 scale, ``[rows', inter]`` and ``[rows', 1]``, the rows padded to
    a multiple of 16 with zeros, as ``_scaled_mm`` takes them."""
    rows, width = gate_up.shape
    inter = width // 2
    padded = -(-rows // _ROWS_MULTIPLE) * _ROWS_MULTIPLE
    out = torch.empty(padded, inter, dtype=FP8, device=gate_up.device)
    scale = torch.empty(padded, 1, dtype=torch.float32, device=gate_up.device)
    block = 1 << max(0, inter - 1).bit_length()
    _kernel[(padded,)](
        gate_up,
        out,
        scale,
        rows,
        gate_up.stride(0),
        out.stride(0),
        inter=inter,
        block=block,
        fp8_max=FP8_MAX,
        num_warps=min(16, max(1, block // 512)),
    )
    return out, scale
