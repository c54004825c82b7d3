"""One-row projections on the GPU as a Triton kernel of the engine's own: ``x @ weight.T`` for a
single token, the kernel a lone request's decode step spends most of its time in.

At one row a projection is a pure read of its weight matrix: each program reads ``block_n``
whole rows of the weight in ``block_k`` slices, multiplies them with the activations and sums in
float32. The weight is read in its stored dtype (bf16, or FP8 with one float32 scale per output
row, applied once per row at the end), so FP8 halves the bytes a step reads without quantizing the
activations (``_scaled_mm`` pads the row to a tile of 16 and quantizes it first). Three options
take whole kernels out of a layer:

- ``gated``: for the fused gate/up matrix ``[2 * I, K]``, each program reads a row of the gate
  half and the matching row of the up half and writes ``silu(gate) * up`` (``[I]``), rounding
  each of the three values to the model's dtype as transformers' MLP does;
- ``residual``: adds the residual stream to the product (the output and down projections);
- ``norm_eps``: the row is RMS-normalised first, the norm's weight having been folded into the
  matrix (``weights.take_weights``): the norm is then one scalar per row, ``rsqrt(mean(x^2) +
  eps)``, which each program sums up in the loop that reads the row anyway and multiplies its
  sums with at the end, so the norm costs no kernel and no extra pass. (A first version that
  applied the norm's weight in the kernel needed a pass over the row before the main loop, and
  measured slower than the separate norm kernel: docs/benchmarks.md, run 39; summed in the
  loop it measured slower too, runs 42-43.) With ``norm_sum`` the sum of squares comes from
  the kernel that wrote the row instead: ``sum_into`` makes a projection add its output's
  squares up (one atomic add per program), and ``zero`` clears a sum after its readers ran, so
  a chain of projections normalises without summing anything twice and without a norm kernel.
  The atomic adds arrive in any order, so the sum's last bits can differ from run to run.

The kernel itself is in ``gemv_kernel.py``; where Triton is missing (a CPU build of torch has
none) ``available()`` is false and the engine keeps its other paths. The block sizes per shape
were chosen on the H200 with ``python -m loadtests.kernels --gemv-sweep`` (docs/benchmarks.md);
other shapes get ``DEFAULT``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from service.engine.fast.launch import pdl_args

# Bound at import, as the runs on the H200 traced it: inside compiled code a module constant
# costs dynamo nothing (no import or lookup to trace).
_kernel: Any
try:
    from service.engine.fast.gemv_kernel import gemv as _kernel
except ImportError:  # no Triton (a CPU build of torch)
    _kernel = None


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int
    block_k: int
    warps: int
    stages: int


DEFAULT = GemvConfig(block_n=4, block_k=1024, warps=4, stages=2)
# (output rows, inputs, bytes per weight) -> the fastest config of the sweep on the H200, for
# the 7B's fused QKV, output, gated gate/up (output rows of one half) and down projections.
# Written by ``python -m loadtests.gpu.tune_gemv kernels.json`` from a sweep's report.
# tuned: begin
TUNED: dict[tuple[int, int, int], GemvConfig] = {
    (6144, 4096, 2): GemvConfig(2, 1024, 4, 2),
    (6144, 4096, 1): GemvConfig(8, 512, 4, 2),
    (4096, 4096, 2): GemvConfig(2, 1024, 4, 2),
    (4096, 4096, 1): GemvConfig(8, 1024, 4, 2),
    (14336, 4096, 2): GemvConfig(2, 512, 4, 2),
    (14336, 4096, 1): GemvConfig(2, 512, 4, 2),
    (4096, 14336, 2): GemvConfig(2, 1024, 4, 2),
    (4096, 14336, 1): GemvConfig(8, 1024, 4, 2),
}
# tuned: end


def runs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether rows of ``dtype`` on ``device`` take the kernel: 16-bit on CUDA, with Triton
    present (float32 keeps cuBLAS, whose sums the float32 fidelity check compares against)."""
    cuda = device.type == "cuda"
    return cuda and dtype in (torch.bfloat16, torch.float16) and _kernel is not None


def available(x: torch.Tensor) -> bool:
    """Whether ``x`` can take the kernel (``runs`` for its dtype and device)."""
    return runs(x.dtype, x.device)


def config_for(outputs: int, inputs: int, weight: torch.Tensor) -> GemvConfig:
    return TUNED.get((outputs, inputs, weight.element_size()), DEFAULT)


def one_row(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    *,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    norm_eps: float | None = None,
    norm_sum: torch.Tensor | None = None,
    sum_into: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` (``x``: ``[1, K]``), or ``silu(gate) * up`` of the two halves when
    ``gated``, plus ``residual`` when given; with ``norm_eps``, of ``x`` RMS-normalised without
    a weight, its sum of squares read from ``norm_sum`` (float32, one element) when given and
    summed in the kernel otherwise; ``[1, N]`` in ``x``'s dtype. ``sum_into`` (float32, one
    element, zero before the call) gets the output's sum of squares added, for the norm of the
    projection that reads it; ``zero`` (the same) is set to zero once the kernel has run.
    ``pdl``: launched with programmatic dependent launch (``launch.py``; not inside
    ``torch.compile``)."""
    outputs = weight.shape[0] // 2 if gated else weight.shape[0]
    inputs = weight.shape[1]
    chosen = config or config_for(outputs, inputs, weight)
    out = torch.empty(1, outputs, dtype=x.dtype, device=x.device)
    grid = (-(-outputs // chosen.block_n),)
    _kernel[grid](
        x,
        weight,
        weight if scale is None else scale,
        x if residual is None else residual,
        out,
        # Unused pointers stand in as the weight (never read: their flags are off).
        weight if norm_sum is None else norm_sum,
        weight if sum_into is None else sum_into,
        weight if zero is None else zero,
        outputs,
        inputs,
        weight.stride(0),
        0.0 if norm_eps is None else norm_eps,
        has_scale=scale is not None,
        swiglu=gated,
        has_residual=residual is not None,
        has_norm=norm_eps is not None,
        norm_from_sum=norm_sum is not None,
        sum_out=sum_into is not None,
        zero_after=zero is not None,
        block_n=chosen.block_n,
        block_k=chosen.block_k,
        num_warps=chosen.warps,
        num_stages=chosen.stages,
        early_weights=pdl,
        **pdl_args(pdl, x.device),
    )
    return out
