"""The kernels for bitsandbytes weights (``quant_gemv.py``) in Triton's interpreter: NF4 codes
with float32 block maxima and with bitsandbytes' 8-bit double quantization of them, and int8
rows, each equal to the product over ``linear.dequantize``'s weights: one row with the SwiGLU and
residual epilogues, and batches; the weight dequantized a slice at a time; and the projections
taking each kernel (or bitsandbytes' own one-row 4-bit product) where it runs."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.quant_kernels import NF4
from service.engine.fast import quant_gemv
from service.engine.fast.gemv import GemvConfig
from service.engine.fast.linear import GROUP, Linear, NestedMaxima, dequantize
from service.engine.fast.projections import gated_product, project

pytestmark = pytest.mark.usefixtures("interpreted")


@pytest.fixture
def interpreted() -> None:
    pytest.importorskip("triton")
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by tests/conftest.py


def _nf4(outputs: int, inputs: int, nested: bool, seed: int) -> Linear:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (outputs, inputs // 2), dtype=torch.uint8, generator=generator)
    table = torch.tensor(NF4)
    blocks = inputs // 64
    # Block maxima of a trained layer's size: products of order one, no overflow in the SiLU.
    size = inputs**-0.5
    if not nested:
        return Linear(codes, torch.rand(outputs, blocks, generator=generator) * size, table)
    groups = outputs * blocks // GROUP
    quantized = torch.randint(0, 256, (outputs, blocks), dtype=torch.uint8, generator=generator)
    double = NestedMaxima(
        code=torch.linspace(-1, 1, 256),
        absmax=(torch.rand(groups, generator=generator) + 0.5) * size,
        offset=torch.rand(groups, generator=generator) * size,
    )
    return Linear(codes, quantized, table, double)


def _int8(outputs: int, inputs: int, seed: int) -> Linear:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, generator=generator)
    return Linear(values, torch.rand(outputs, 1, generator=generator) * 4 * inputs**-0.5)


def _dense(p: Linear) -> torch.Tensor:
    assert p.scale is not None
    return dequantize(p.weight, p.scale, p.code, torch.float32, p.nested)


def _swiglu(product: torch.Tensor) -> torch.Tensor:
    gate, up = product.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


CONFIGS = [GemvConfig(4, 128, 4, 2), GemvConfig(16, 1024, 4, 2)]


@pytest.mark.parametrize("kind", ["nf4", "nf4-nested", "int8"])
@settings(max_examples=6, deadline=None)
@given(
    # Outputs and inputs off the blocks' multiples (the masks); nested maxima come in whole
    # groups of 256 (several per matrix, so a maximum's group is found by its place).
    shape=st.sampled_from([(50, 640), (64, 256), (128, 512)]),
    nested_shape=st.sampled_from([(96, 512), (128, 512)]),
    config=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_computes_the_product_of_the_dequantized_weights(
    kind: str,
    shape: tuple[int, int],
    nested_shape: tuple[int, int],
    config: GemvConfig,
    seed: int,
) -> None:
    nested = kind == "nf4-nested"
    outputs, inputs = nested_shape if nested else shape
    p = _int8(outputs, inputs, seed) if kind == "int8" else _nf4(outputs, inputs, nested, seed)
    x = torch.randn(1, inputs, generator=torch.Generator().manual_seed(seed))
    exact = x @ _dense(p).T

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)

    close(quant_gemv.one_row(x, p, config=config), exact)
    residual = torch.randn(1, outputs)
    close(quant_gemv.one_row(x, p, residual=residual, config=config), residual + exact)
    gated = quant_gemv.one_row(x, p, gated=True, config=config)
    assert gated.shape == (1, outputs // 2)
    close(gated, _swiglu(exact))


@pytest.mark.parametrize("kind", ["nf4", "nf4-nested", "int8"])
@settings(max_examples=5, deadline=None)
@given(
    shape=st.sampled_from([(50, 640), (64, 256), (136, 512)]),
    nested_shape=st.sampled_from([(96, 512), (128, 512)]),
    batch=st.integers(2, 40),
    config=st.sampled_from(
        [
            None,
            quant_gemv.MatmulConfig(16, 32, 64, 4, 2),
            quant_gemv.MatmulConfig(32, 64, 128, 4, 2),
        ]
    ),
    seed=st.integers(0, 2**16),
)
def test_the_batch_kernel_computes_the_product_of_the_dequantized_weights(
    kind: str,
    shape: tuple[int, int],
    nested_shape: tuple[int, int],
    batch: int,
    config: quant_gemv.MatmulConfig | None,
    seed: int,
) -> None:
    # Batches off the tiles' multiples, weight rows off block_n's: the masks.
    nested = kind == "nf4-nested"
    outputs, inputs = nested_shape if nested else shape
    p = _int8(outputs, inputs, seed) if kind == "int8" else _nf4(outputs, inputs, nested, seed)
    x = torch.randn(batch, inputs, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(quant_gemv.rows(x, p, config), x @ _dense(p).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["nf4", "nf4-nested", "int8"])
def test_the_dequantizing_kernel_writes_bitsandbytes_numbers(kind: str) -> None:
    # Off the blocks' multiples in rows and (for int8) inputs: the masks.
    nested = kind == "nf4-nested"
    outputs, inputs = (96, 512) if nested else (50, 640)
    p = _int8(outputs, 600, 5) if kind == "int8" else _nf4(outputs, inputs, nested, 5)
    dense = quant_gemv.dequantized(p, torch.float32, block_n=16, block_k=128)
    torch.testing.assert_close(dense, _dense(p), rtol=0, atol=0)


def _bitsandbytes_gemv(
    x: torch.Tensor,
    codes: torch.Tensor,
    shape: list[int],
    maxima: torch.Tensor,
    table: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """bitsandbytes' GEMV as its own operators define it, on a CPU: its 4-bit dequantization of
    the same arguments (exact in float32 here), then the product."""
    assert torch.equal(table, torch.tensor(NF4))
    weight: torch.Tensor = torch.ops.bitsandbytes.dequantize_4bit.default(
        codes, maxima, block, "nf4", shape, torch.float32
    )
    return x @ weight.T


def test_each_shape_takes_its_kernel_where_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a GPU with 16-bit rows: one row of int8 takes the one-row kernel (here in the
    # interpreter), one row of 4-bit codes bitsandbytes' GEMV with their bytes, maxima and block
    # as it reads them, a batch of int8 the batch kernel up to INT8_ROWS, every other batch the
    # weight dequantized; all compute the same.
    pytest.importorskip("bitsandbytes")
    taken: list[str] = []

    def counted(name: str) -> None:
        original = getattr(quant_gemv, name)

        def call(*args: object, **kwargs: object) -> torch.Tensor:
            taken.append(name)
            out: torch.Tensor = original(*args, **kwargs)
            return out

        monkeypatch.setattr(quant_gemv, name, call)

    monkeypatch.setattr(quant_gemv, "available", lambda x: True)
    monkeypatch.setattr(quant_gemv, "_gemv_4bit", _bitsandbytes_gemv)
    for name in ("one_row", "rows", "dequantized", "_gemv_4bit"):
        counted(name)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
    residual = torch.randn(3, 64)

    def check(p: Linear, rows: int, expected: list[str]) -> None:
        exact = x[:rows] @ _dense(p).T
        taken.clear()
        torch.testing.assert_close(
            project(x[:rows], p, residual=residual[:rows]),
            residual[:rows] + exact,
            rtol=1e-4,
            atol=1e-4,
        )
        torch.testing.assert_close(gated_product(x[:rows], p), _swiglu(exact), rtol=1e-4, atol=1e-4)
        assert taken == expected * 2

    for nested in (False, True):
        nf4 = _nf4(64, 256, nested=nested, seed=3)
        check(nf4, 1, ["_gemv_4bit"])
        check(nf4, 2, ["dequantized"])
    int8 = _int8(64, 256, seed=3)
    check(int8, 1, ["one_row"])
    check(int8, 3, ["rows"])
    monkeypatch.setattr(quant_gemv, "INT8_ROWS", 2)  # a batch wider than the kernel's best
    check(int8, 3, ["dequantized"])
    # A norm to apply first keeps the general path (norms never fold into these weights).
    taken.clear()
    project(x[:1], int8, norm_eps=1e-5)
    assert taken == ["rows"]


@pytest.mark.parametrize("kind", ["nf4", "nf4-nested", "int8"])
@settings(max_examples=5, deadline=None)
@given(slice_rows=st.sampled_from([256, 512]), outputs=st.sampled_from([640, 768, 1152]))
def test_a_weight_wider_than_a_slice_is_dequantized_a_slice_at_a_time(
    kind: str, slice_rows: int, outputs: int
) -> None:
    # The output layer's rows a slice at a time: every slice's codes, maxima and nested groups
    # are the weight's own (a slice that took the wrong group would scale its rows wrongly).
    inputs = 128
    p = _int8(outputs, inputs, 7) if kind == "int8" else _nf4(outputs, inputs, kind != "nf4", 7)
    x = torch.randn(3, inputs, generator=torch.Generator().manual_seed(7))
    written: list[int] = []
    original = quant_gemv.dequantized

    def counted(q: Linear, dtype: torch.dtype) -> torch.Tensor:
        written.append(q.weight.shape[0])
        return original(q, dtype)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_gemv, "SLICE_BYTES", slice_rows * inputs * 4)
        patch.setattr(quant_gemv, "dequantized", counted)
        product = quant_gemv.dequantized_product(x, p)
        assert quant_gemv.dequantized_bytes([p], torch.float32) == slice_rows * inputs * 4
    torch.testing.assert_close(product, x @ _dense(p).T, rtol=1e-4, atol=1e-4)
    assert max(written) <= slice_rows
    assert sum(written) == outputs


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), blocks=st.sampled_from([4, 8, 64]), seed=st.integers(0, 99))
def test_the_nested_maxima_in_one_kernel_are_bitsandbytes_maxima(
    rows: int, blocks: int, seed: int
) -> None:
    # Any count of maxima (whole groups of GROUP, as bitsandbytes makes them), a last program
    # only partly full included: the kernel's maxima are NestedMaxima.maxima's.
    rows = -(-rows * blocks // GROUP) * GROUP // blocks
    generator = torch.Generator().manual_seed(seed)
    quantized = torch.randint(0, 256, (rows, blocks), dtype=torch.uint8, generator=generator)
    groups = rows * blocks // GROUP
    nested = NestedMaxima(
        code=torch.linspace(-1, 1, 256),
        absmax=torch.rand(groups, generator=generator) + 0.5,
        offset=torch.rand(groups, generator=generator),
    )
    p = Linear(
        torch.zeros(rows, 32 * blocks, dtype=torch.uint8), quantized, torch.tensor(NF4), nested
    )
    expected = nested.maxima(quantized).reshape(-1)
    torch.testing.assert_close(quant_gemv._maxima(p), expected, rtol=1e-6, atol=0)
