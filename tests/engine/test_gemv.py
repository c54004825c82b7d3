"""The fast engine's one-row projection kernel (``gemv.py``) and the dispatch around it.

The kernel is a GPU kernel; here Triton's interpreter runs the same kernel code on the CPU
(``TRITON_INTERPRET=1``), so its indexing, masks, FP8 scales and epilogues are checked against
torch. The interpreter rounds to bf16 by truncation where the GPU rounds to nearest, so the exact
comparisons are in float32 and bf16 is checked to its rounding only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from loadtests.gpu import tune_gemv
from service.engine.fast import gemv
from service.engine.fast.linear import Linear, quantize_fp8
from service.engine.fast.projections import gated_product, project, rms_norm

# Shapes that are not multiples of the blocks: the masks matter.
OUTPUTS, INPUTS = 50, 70
CONFIGS = [gemv.GemvConfig(4, 32, 4, 2), gemv.GemvConfig(16, 128, 4, 2)]


@pytest.fixture
def interpreted() -> None:
    pytest.importorskip("triton")
    # Set by tests/conftest.py before Triton is imported.
    assert os.environ.get("TRITON_INTERPRET") == "1"


def _swiglu(product: torch.Tensor) -> torch.Tensor:
    gate, up = product.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize("config", CONFIGS, ids=["small-blocks", "large-blocks"])
def test_one_row_kernel_computes_the_projection_and_its_epilogues(
    config: gemv.GemvConfig,
) -> None:
    torch.manual_seed(0)
    weight = torch.randn(OUTPUTS, INPUTS)
    x = torch.randn(1, INPUTS)
    exact = x @ weight.T

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)

    close(gemv.one_row(x, weight, None, config=config), exact)
    residual = torch.randn(1, OUTPUTS)
    close(gemv.one_row(x, weight, None, residual=residual, config=config), residual + exact)
    gated = gemv.one_row(x, weight, None, gated=True, config=config)
    assert gated.shape == (1, OUTPUTS // 2)
    close(gated, _swiglu(exact))
    # Launched for programmatic dependent launch, the first slice of the weights is read
    # before the row (the interpreter leaves CUDA's wait out): the same results.
    early = gemv.one_row(x, weight, None, residual=residual, config=config, pdl=True)
    close(early, residual + exact)
    close(gemv.one_row(x, weight, None, gated=True, config=config, pdl=True), _swiglu(exact))
    # FP8: the weights read as they are and scaled per output row at the end, the row itself
    # not quantized: the product of the dequantized weights.
    fp8 = quantize_fp8(weight)
    assert fp8.scale is not None
    dequantized = fp8.weight.float() * fp8.scale
    close(gemv.one_row(x, fp8.weight, fp8.scale, config=config), x @ dequantized.T)
    close(
        gemv.one_row(x, fp8.weight, fp8.scale, gated=True, config=config),
        _swiglu(x @ dequantized.T),
    )


@pytest.mark.usefixtures("interpreted")
def test_one_row_kernel_normalises_the_row_for_a_folded_norm() -> None:
    # The norm's weight folded into the matrix, the kernel applies rsqrt(mean(x^2) + eps):
    # the product of the normalised row, as rms_norm then the projection compute it.
    torch.manual_seed(3)
    weight = torch.randn(OUTPUTS, INPUTS)
    norm = torch.rand(INPUTS) + 0.5
    x = 3 * torch.randn(1, INPUTS)
    folded = weight * norm
    normed = rms_norm(x, norm, 1e-5)
    # The kernel sums the squares in its own order: a few float32 ulps of the norm, which the
    # product (and SwiGLU's) carries, hence 1e-4 rather than the plain product's 1e-5.
    for config in CONFIGS:
        out = gemv.one_row(x, folded, None, norm_eps=1e-5, config=config)
        torch.testing.assert_close(out, normed @ weight.T, rtol=1e-4, atol=1e-4)
        gated = gemv.one_row(x, folded, None, gated=True, norm_eps=1e-5, config=config)
        torch.testing.assert_close(gated, _swiglu(normed @ weight.T), rtol=1e-4, atol=1e-4)
        early = gemv.one_row(x, folded, None, norm_eps=1e-5, config=config, pdl=True)
        torch.testing.assert_close(early, normed @ weight.T, rtol=1e-4, atol=1e-4)
    fp8 = quantize_fp8(folded)
    assert fp8.scale is not None
    out = gemv.one_row(x, fp8.weight, fp8.scale, norm_eps=1e-5, config=CONFIGS[0])
    dequantized = fp8.weight.float() * fp8.scale
    torch.testing.assert_close(out, rms_norm(x, None, 1e-5) @ dequantized.T, rtol=1e-5, atol=1e-5)
    # Off the kernel, project() normalises the same way before its matmul.
    torch.testing.assert_close(
        project(x.repeat(2, 1), Linear(folded), norm_eps=1e-5),
        (normed @ weight.T).repeat(2, 1),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize("config", CONFIGS, ids=["small-blocks", "large-blocks"])
def test_one_row_kernels_pass_the_norms_sums_of_squares_along(config: gemv.GemvConfig) -> None:
    # A layer's chain on one row: the output projection (plus residual) adds its output's
    # squares to the post-attention norm's sum and clears the input norm's, the gate/up
    # projection normalises with that sum, the down projection (plus residual) passes its own
    # squares to the next layer's sum and clears the one gate/up read.
    torch.manual_seed(4)
    attended, residual = torch.randn(1, INPUTS), 2 * torch.randn(1, OUTPUTS)
    o_weight = torch.randn(OUTPUTS, INPUTS)
    norm = torch.rand(OUTPUTS) + 0.5
    gate_up = torch.randn(2 * INPUTS, OUTPUTS)
    down = torch.randn(OUTPUTS, INPUTS)
    sums, next_sums = torch.tensor([5.0, 0.0]), torch.zeros(2)

    x = gemv.one_row(
        attended,
        o_weight,
        None,
        residual=residual,
        sum_into=sums[1:2],
        zero=sums[0:1],
        config=config,
    )
    torch.testing.assert_close(x, residual + attended @ o_weight.T, rtol=1e-5, atol=1e-5)
    assert sums[0].item() == 0.0  # read by the QKV projection before: cleared
    torch.testing.assert_close(sums[1], x.pow(2).sum(), rtol=1e-5, atol=1e-5)

    folded = gate_up * norm
    activated = gemv.one_row(
        x, folded, None, gated=True, norm_eps=1e-5, norm_sum=sums[1:2], config=config
    )
    expected = _swiglu(rms_norm(x, norm, 1e-5) @ gate_up.T)
    torch.testing.assert_close(activated, expected, rtol=1e-4, atol=1e-4)
    # The sum, not the row, is what the kernel normalises with: a wrong sum shows.
    doubled = sums[1:2] * 4
    wrong = gemv.one_row(
        x, folded, None, gated=True, norm_eps=1e-5, norm_sum=doubled, config=config
    )
    assert not torch.allclose(wrong, expected, rtol=1e-2, atol=1e-2)

    out = gemv.one_row(
        activated,
        down,
        None,
        residual=x,
        sum_into=next_sums[0:1],
        zero=sums[1:2],
        config=config,
    )
    torch.testing.assert_close(out, x + activated @ down.T, rtol=1e-4, atol=1e-4)
    assert sums.tolist() == [0.0, 0.0]  # both of this layer's sums are ready for the next step
    torch.testing.assert_close(next_sums[0], out.pow(2).sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("interpreted")
def test_one_row_kernel_answers_in_the_rows_dtype() -> None:
    torch.manual_seed(1)
    weight = torch.randn(OUTPUTS, INPUTS, dtype=torch.bfloat16)
    x = torch.randn(1, INPUTS, dtype=torch.bfloat16)
    out = gemv.one_row(x, weight, None, config=CONFIGS[0])
    assert out.dtype == torch.bfloat16
    exact = x.float() @ weight.float().T
    # Within bf16's rounding of the float32 sum (8 bits of mantissa).
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-7 + 1e-3).all()


def test_the_one_row_kernel_is_for_16_bit_rows_on_a_gpu() -> None:
    # float32 keeps cuBLAS (the float32 fidelity check compares sums with transformers'), and a
    # CPU has no kernel to run.
    assert not gemv.available(torch.zeros(1, 4, dtype=torch.bfloat16))
    assert not gemv.available(torch.zeros(1, 4))
    assert (
        gemv.config_for(14336, 4096, torch.zeros(1, dtype=torch.float8_e4m3fn))
        == (gemv.TUNED[(14336, 4096, 1)])
    )
    assert gemv.config_for(3, 5, torch.zeros(1)) == gemv.DEFAULT


def test_projections_off_the_kernel_write_the_operations_out() -> None:
    torch.manual_seed(2)
    weight = torch.randn(8, 6)
    x = torch.randn(3, 6)
    residual = torch.randn(3, 8)
    torch.testing.assert_close(project(x, Linear(weight), residual), residual + x @ weight.T)
    torch.testing.assert_close(gated_product(x, Linear(weight)), _swiglu(x @ weight.T))


def test_the_sweep_report_rewrites_the_tuned_table(tmp_path: Path) -> None:
    report: dict[str, Any] = {
        "gemv_sweep": {
            "configs": 2,
            "qkv-cublas_us": 15.0,
            "qkv-fp8": {
                "best": [{"block_n": 8, "block_k": 512, "warps": 4, "stages": 2, "us": 10.1}],
                "outputs": 6144,
                "inputs": 4096,
                "weight_bytes": 1,
            },
        }
    }
    module = tmp_path / "gemv.py"
    source = Path(gemv.__file__).read_text()
    module.write_text(source)
    tune_gemv.main([str(_write(tmp_path / "kernels.json", report)), "--module", str(module)])
    rewritten = module.read_text()
    assert "    (6144, 4096, 1): GemvConfig(8, 512, 4, 2),\n}\n# tuned: end" in rewritten
    # Only the table changed.
    head, _, tail = source.partition(tune_gemv.BEGIN)
    assert rewritten.startswith(head + tune_gemv.BEGIN)
    assert rewritten.endswith(tail.partition(tune_gemv.END)[2])
    namespace: dict[str, object] = {"GemvConfig": gemv.GemvConfig}
    exec(tune_gemv.table(report), namespace)
    assert namespace["TUNED"] == {(6144, 4096, 1): gemv.GemvConfig(8, 512, 4, 2)}


def _write(path: Path, report: dict[str, Any]) -> Path:
    path.write_text(json.dumps(report))
    return path
