"""An FP8 MLP's activation by the engine's own kernel (``swiglu_fp8.py``) against the torch code
it replaces (``projections.swiglu``, then ``linear.fp8_linear``'s scaling and cast), in Triton's
interpreter: widths that are not powers of two, row counts that are not multiples of 16 (the
padding ``_scaled_mm`` takes), rows of zeros and of large values; and the down projection it
feeds equal to the unfused one."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast import swiglu_fp8
from service.engine.fast.linear import FP8, quantize_fp8, quantize_rows
from service.engine.fast.projections import gated_down, gated_product, project, swiglu

pytest.importorskip("triton")


def _reference(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the torch code casts: ``silu(gate) * up`` in the model's dtype, then each row's
    absolute maximum over e4m3's largest, as ``fp8_linear`` scales it."""
    return quantize_rows(swiglu(gate_up))


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 40),
    inter=st.sampled_from([16, 24, 100, 128]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    magnitude=st.sampled_from([0.0, 1.0, 40.0]),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_casts_what_the_torch_code_casts(
    rows: int, inter: int, dtype: torch.dtype, magnitude: float, seed: int
) -> None:
    torch.manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * inter) * magnitude).to(dtype)
    values, scales = swiglu_fp8.quantized(gate_up)
    padded = -(-rows // 16) * 16
    assert values.shape == (padded, inter)
    assert values.dtype == FP8
    assert scales.shape == (padded, 1)
    assert scales.dtype == torch.float32
    wanted, wanted_scales = _reference(gate_up)
    # Triton's interpreter rounds to bfloat16 and to e4m3 losing the carry of a mantissa that
    # rounds up into the next power of two (docs: the RoPE kernel's test says the same): the
    # row's maximum, so its scale, may come out a bfloat16 step low, and a value half what it
    # should be; with the scale a step off, a value may land on the next e4m3 step (an eighth
    # of it at most). Everywhere else the kernel casts what the torch code casts (on a GPU the
    # conversions are the hardware's, exact).
    torch.testing.assert_close(scales[:rows], wanted_scales, rtol=0.02, atol=0)
    mine = values[:rows].float() * scales[:rows]
    theirs = wanted.float() * wanted_scales
    # (and e4m3's subnormals, under 2^-6 of a scale, are not rounded as a GPU rounds them)
    tiny = wanted_scales * 2**-5
    close = (mine - theirs).abs() <= 0.13 * theirs.abs() + tiny
    halved = (2 * mine - theirs).abs() <= 0.13 * theirs.abs() + tiny
    assert bool((close | halved).all())
    assert close.float().mean() > 0.8
    # The padding rows are zeros, as ``fp8_linear`` pads with them.
    assert not values[rows:].float().any()


def test_the_down_projection_of_the_cast_activation_equals_the_unfused_one() -> None:
    torch.manual_seed(0)
    hidden, inter, rows = 64, 96, 20
    gate_up = quantize_fp8(torch.randn(2 * inter, hidden, dtype=torch.bfloat16) / 8)
    down = quantize_fp8(torch.randn(hidden, inter, dtype=torch.bfloat16) / 8)
    x = torch.randn(rows, hidden, dtype=torch.bfloat16)
    residual = torch.randn(rows, hidden, dtype=torch.bfloat16)
    fused = gated_down(x, gate_up, down, residual, norm_eps=1e-6)
    unfused = project(gated_product(x, gate_up, norm_eps=1e-6), down, residual=residual)
    assert fused.shape == unfused.shape == (rows, hidden)
    # Near the unfused product, as far as the interpreter's lost carries (above) let it be;
    # a wrong row, half or stride would be as far off as the product itself.
    change = (unfused.float() - residual.float()).norm()
    assert float((fused.float() - unfused.float()).norm()) < 0.1 * float(change)


def test_the_engine_takes_it_for_fp8_rows_on_a_gpu_only() -> None:
    down = quantize_fp8(torch.randn(8, 16))
    rows = torch.randn(4, 16)
    assert not swiglu_fp8.runs(rows, down)  # a CPU tensor
