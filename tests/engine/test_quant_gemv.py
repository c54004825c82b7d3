"""The kernels for bitsandbytes weights (``quant_gemv.py``) in Triton's interpreter: NF4 codes
with float32 block maxima and with bitsandbytes' 8-bit double quantization of them, and int8
rows, each equal to the product over ``linear.dequantize``'s weights: one row with the SwiGLU and
residual epilogues, a few rows, and batches; the weight dequantized a slice at a time; and the
projections taking each kernel (or bitsandbytes' own one-row 4-bit product) where it runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadtests.quant_kernels import NF4
from service.engine.fast import batch_tiles, quant_gemv
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


@settings(max_examples=8, deadline=None)
@given(
    # Outputs and inputs off the blocks' multiples (the masks).
    shape=st.sampled_from([(50, 640), (64, 256), (128, 512)]),
    config=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_the_int8_row_kernel_computes_the_product_of_the_dequantized_weights(
    shape: tuple[int, int], config: GemvConfig, seed: int
) -> None:
    outputs, inputs = shape
    _check_row_kernel(quant_gemv.one_row, _int8(outputs, inputs, seed), config, seed)


def _check_row_kernel(
    row: Callable[..., torch.Tensor], p: Linear, config: GemvConfig, seed: int
) -> None:
    """``row`` (a one-row product) plain, with a residual and gated: each equal to the product
    over the weight's dequantized values."""
    outputs, inputs = p.weight.shape[0], p.weight.shape[1] * (2 if p.code is not None else 1)
    x = torch.randn(1, inputs, generator=torch.Generator().manual_seed(seed))
    exact = x @ _dense(p).T

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)

    close(row(x, p, config=config), exact)
    residual = torch.randn(1, outputs)
    close(row(x, p, residual=residual, config=config), residual + exact)
    gated = row(x, p, gated=True, config=config)
    assert gated.shape == (1, outputs // 2)
    close(gated, _swiglu(exact))


FOUR_BIT_CONFIGS = [GemvConfig(4, 128, 4, 2), GemvConfig(16, 1024, 4, 2), GemvConfig(2, 256, 2, 1)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nested", [False, True])
@settings(max_examples=3, deadline=None)
@given(
    shape=st.sampled_from([(50, 640), (64, 256), (128, 512)]),
    nested_shape=st.sampled_from([(96, 512), (128, 512)]),
    config=st.sampled_from(FOUR_BIT_CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_the_four_bit_row_kernel_computes_the_product_of_the_dequantized_weights(
    dtype: torch.dtype,
    nested: bool,
    shape: tuple[int, int],
    nested_shape: tuple[int, int],
    config: GemvConfig,
    seed: int,
) -> None:
    # Its table read from memory (Triton's interpreter runs no inline assembly; the lookup's
    # PTX has its own tests): the slices, blocks, maxima, masks, halves and epilogue checked.
    outputs, inputs = nested_shape if nested else shape
    p = _nf4(outputs, inputs, nested, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, inputs, generator=generator).to(dtype)
    exact = x.float() @ _dense(p).T
    row = partial(quant_gemv.four_bit_row, config=config, in_registers=False)

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        assert actual.dtype == dtype
        torch.testing.assert_close(actual.float(), expected, rtol=2e-2, atol=2e-2)

    close(row(x, p), exact)
    residual = torch.randn(1, outputs, generator=generator).to(dtype)
    close(row(x, p, residual=residual), residual.float() + exact)
    gated = row(x, p, gated=True)
    assert gated.shape == (1, outputs // 2)
    close(gated, _swiglu(exact))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=4, deadline=None)
@given(
    m=st.integers(1, quant_gemv.FOUR_BIT_ROWS),
    nested=st.booleans(),
    config=st.sampled_from(FOUR_BIT_CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_the_four_bit_rows_kernel_computes_each_row_s_product(
    dtype: torch.dtype, m: int, nested: bool, config: GemvConfig, seed: int
) -> None:
    # A few rows of activations against one lookup of each word (the table read from memory
    # here): every row its own product, residual and gated halves, rows past ``m`` unwritten.
    p = _nf4(96, 512, nested, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 512, generator=generator).to(dtype)
    exact = x.float() @ _dense(p).T
    rows = partial(quant_gemv.four_bit_rows, config=config, in_registers=False)

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        assert actual.dtype == dtype
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual.float(), expected, rtol=2e-2, atol=2e-2)

    close(rows(x, p), exact)
    residual = torch.randn(m, 96, generator=generator).to(dtype)
    close(rows(x, p, residual=residual), residual.float() + exact)
    close(rows(x, p, gated=True), _swiglu(exact))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=6, deadline=None)
@given(
    m=st.integers(1, 40),
    outputs=st.sampled_from([64, 96]),
    nested=st.booleans(),
    config=st.sampled_from(
        [batch_tiles.MatmulConfig(16, 32, 0, 4, 2), batch_tiles.MatmulConfig(32, 64, 0, 4, 3)]
    ),
    seed=st.integers(0, 2**16),
)
@example(m=33, outputs=96, nested=True, config=batch_tiles.MatmulConfig(16, 32, 0, 4, 2), seed=1)
def test_the_four_bit_matmul_kernel_scales_each_block_s_product_once(
    dtype: torch.dtype,
    m: int,
    outputs: int,
    nested: bool,
    config: batch_tiles.MatmulConfig,
    seed: int,
) -> None:
    # Rows of activations on the tensor cores (the table read from memory here, in the
    # layout the lookup's PTX gives): each block's codes as their 16-bit table values, their
    # product summed in float32 and scaled by the block's maximum, so the result is the
    # product over the weights of a table rounded to the dtype, rounded once at the end. A
    # code in the wrong place, or a maximum of another block, is off by whole units.
    p = _nf4(outputs, 512, nested, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 512, generator=generator).to(dtype)
    assert p.code is not None
    rounded = Linear(p.weight, p.scale, p.code.to(dtype).float(), p.nested)
    expected = x.float() @ _dense(rounded).T
    got = quant_gemv.four_bit_matmul(x, p, config, in_registers=False)
    assert got.dtype == dtype
    assert got.shape == (m, outputs)
    tolerance = 8e-3 if dtype == torch.bfloat16 else 1e-3
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)
    # The nested maxima dequantized by their own kernel first: the same float32 numbers, and
    # that kernel ran (float32 maxima need none).
    dequantized: list[torch.Tensor] = []
    original = quant_gemv._maxima

    def maxima(q: Linear) -> torch.Tensor:
        dequantized.append(original(q))
        return dequantized[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_gemv, "_maxima", maxima)
        first = quant_gemv.four_bit_matmul(x, p, config, in_registers=False, float_maxima=True)
    torch.testing.assert_close(first, got, rtol=0, atol=0)
    assert len(dequantized) == (1 if nested else 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@settings(max_examples=6, deadline=None)
@given(
    m=st.integers(1, 40),
    # Inputs off the slice's multiple: the last slice's missing blocks are masked.
    inputs=st.sampled_from([512, 448]),
    nested=st.booleans(),
    config=st.sampled_from(
        [batch_tiles.MatmulConfig(16, 32, 128, 4, 2), batch_tiles.MatmulConfig(32, 32, 256, 4, 1)]
    ),
    seed=st.integers(0, 2**16),
)
@example(m=3, inputs=448, nested=True, config=batch_tiles.MatmulConfig(32, 32, 256, 4, 1), seed=1)
def test_the_four_bit_matmul_kernel_scales_each_value_where_a_slice_spans_blocks(
    dtype: torch.dtype,
    m: int,
    inputs: int,
    nested: bool,
    config: batch_tiles.MatmulConfig,
    seed: int,
) -> None:
    # A slice of several blocks, one product for them all: each looked-up value times its
    # block's maximum, rounded to the dtype as bitsandbytes' dequantization rounds it. A value
    # scaled by another block's maximum, or a masked block let in, is off by whole units.
    outputs = 64 if inputs % 256 == 0 else 256  # nested maxima in whole groups of 256
    p = _nf4(outputs, inputs, nested, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, inputs, generator=generator).to(dtype)
    assert p.code is not None
    rounded = Linear(p.weight, p.scale, p.code.to(dtype).float(), p.nested)
    dense = _dense(rounded)
    if dtype == torch.bfloat16:
        # Triton's interpreter truncates a float32-to-bfloat16 cast (a GPU rounds to nearest):
        # half the scaled weights one unit smaller, which now and then summed past the
        # tolerance. The reference rounds them as the interpreter does.
        dense = (dense.view(torch.int32) & -65536).view(torch.float32)
    expected = x.float() @ dense.to(dtype).float().T
    got = quant_gemv.four_bit_matmul(x, p, config, in_registers=False)
    assert got.dtype == dtype
    assert got.shape == (m, outputs)
    tolerance = 8e-3 if dtype == torch.bfloat16 else 1e-3
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


@settings(max_examples=10, deadline=None)
@given(
    m=st.integers(1, 40),
    inputs=st.sampled_from([512, 448]),
    splits=st.integers(2, 9),
    block_k=st.sampled_from([0, 256]),
    seed=st.integers(0, 2**16),
)
@example(m=5, inputs=448, splits=3, block_k=0, seed=1)
def test_the_four_bit_matmul_kernel_split_over_the_inputs_adds_every_slice_once(
    m: int, inputs: int, splits: int, block_k: int, seed: int
) -> None:
    # Programs over shares of the inputs (whole slices each; 448 inputs leave the last share
    # short, more splits than slices leave some empty): their float32 sums added give the
    # product. A slice summed twice or skipped is off by a block's whole contribution.
    dtype = torch.float16
    outputs = 64 if inputs % 256 == 0 else 256  # nested maxima in whole groups of 256
    p = _nf4(outputs, inputs, True, seed)
    x = torch.randn(m, inputs, generator=torch.Generator().manual_seed(seed)).to(dtype)
    assert p.code is not None
    rounded = Linear(p.weight, p.scale, p.code.to(dtype).float(), p.nested)
    dense = _dense(rounded)
    expected = x.float() @ (dense.to(dtype).float() if block_k else dense).T
    config = batch_tiles.MatmulConfig(16, 32, block_k, 4, 2, splits)
    got = quant_gemv.four_bit_matmul(x, p, config, in_registers=False)
    assert got.dtype == dtype
    assert got.shape == (m, outputs)
    torch.testing.assert_close(got.float(), expected, rtol=1e-3, atol=1e-3)


@given(
    batch=st.integers(5, 128),
    outputs=st.sampled_from([1024, 4096, 6144, 28672]),
    inputs=st.sampled_from([4096, 14336]),
    programs=st.sampled_from([0, 256, 512, 1024]),
)
@example(batch=16, outputs=4096, inputs=14336, programs=512)
def test_a_four_bit_product_splits_its_inputs_only_while_its_grid_is_short(
    batch: int, outputs: int, inputs: int, programs: int
) -> None:
    config = batch_tiles.four_bit_config(batch, outputs)
    slices = inputs // max(64, config.block_k)
    split = batch_tiles.four_bit_split(config, batch, outputs, slices, programs)
    grid = -(-outputs // config.block_n) * -(-batch // config.block_m)
    assert split.splits & (split.splits - 1) == 0  # a power of two
    assert slices // split.splits >= min(slices, batch_tiles.SPLIT_SLICES)
    if config == batch_tiles.WIDE_TILE:
        assert split.splits == 1  # the wide tile's slices span several blocks already
    elif split.splits > 1:
        assert grid * split.splits // 2 < programs  # split only while short of the programs
    else:
        assert grid >= programs or slices // 2 < batch_tiles.SPLIT_SLICES
    assert replace(split, splits=1) == config
    if (batch, outputs, inputs, programs) == (16, 4096, 14336, 512):
        assert split.splits == 4  # the 7B's down projection: 128 programs of 32 rows


@settings(max_examples=12, deadline=None)
@given(offset=st.integers(0, 7), padding=st.integers(0, 7), seed=st.integers(0, 2**16))
@example(offset=0, padding=0, seed=1)
@example(offset=4, padding=8, seed=2)
def test_the_four_bit_row_kernel_takes_only_codes_it_reads_as_whole_words(
    offset: int, padding: int, seed: int
) -> None:
    # It reads four bytes of codes at a time: rows that start off a 4-byte boundary (codes kept
    # inside a wider buffer) go to bitsandbytes' GEMV instead; the rows it takes, it multiplies.
    whole = _nf4(64, 256, False, seed)
    held = torch.zeros(64, 128 + offset + padding, dtype=torch.uint8)
    held[:, offset : offset + 128] = whole.weight
    p = Linear(held[:, offset : offset + 128], whole.scale, whole.code)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(seed)).to(torch.float16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_gemv, "available", lambda x: True)
        runs = quant_gemv.four_bit_row_runs(x, p)
    assert runs == (offset % 4 == 0 and (128 + offset + padding) % 4 == 0)
    if runs:
        out = quant_gemv.four_bit_row(x, p, in_registers=False)
        exact = x.float() @ _dense(whole).T
        torch.testing.assert_close(out.float(), exact, rtol=2e-2, atol=2e-2)


def test_the_choice_of_the_four_bit_row_kernel_traces_into_a_compiled_step() -> None:
    # The engine compiles its steps whole (``fullgraph``): asking the codes' offset there
    # (an int, which dynamo does not trace) failed the NF4 engine's start on the H200 (run 116).
    p = _nf4(64, 256, False, 0)
    x = torch.randn(1, 256, dtype=torch.float16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_gemv, "available", lambda x: True)
        chosen = torch.compile(
            lambda x: x * quant_gemv.four_bit_row_runs(x, p), fullgraph=True, backend="eager"
        )
        assert torch.equal(chosen(x), x)


def test_int8_values_become_floats_exactly_without_a_conversion() -> None:
    # Every int8 value through the kernels' bit trick, in a kernel of this test's own: the
    # floats must be the values themselves.
    from tests.engine.int8_kernel import convert_int8

    values = torch.arange(-128, 128, dtype=torch.int8)
    out = torch.full((256,), float("nan"))
    convert_int8[(1,)](values, out, 256, block=256)
    assert torch.equal(out, values.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_int8_values_become_16_bit_floats_exactly_without_a_conversion(dtype: torch.dtype) -> None:
    # The batch kernel's operands for the tensor cores: every int8 value, exactly.
    from tests.engine.int8_kernel import convert_int8_to

    values = torch.arange(-128, 128, dtype=torch.int8)
    out = torch.full((256,), float("nan"), dtype=dtype)
    convert_int8_to[(1,)](values, out, 256, block=256)
    assert torch.equal(out, values.to(dtype))


@settings(max_examples=8, deadline=None)
@given(
    shape=st.sampled_from([(50, 640), (64, 256), (136, 512)]),
    batch=st.integers(2, 40),
    config=st.sampled_from(
        [
            None,
            batch_tiles.MatmulConfig(16, 32, 64, 4, 2),
            batch_tiles.MatmulConfig(32, 64, 128, 4, 2),
            batch_tiles.matmul_config(128, 4096),  # narrowed to the tensor cores' 16
        ]
    ),
    seed=st.integers(0, 2**16),
)
def test_the_int8_batch_kernel_computes_the_product_of_the_dequantized_weights(
    shape: tuple[int, int], batch: int, config: batch_tiles.MatmulConfig | None, seed: int
) -> None:
    # Batches off the tiles' multiples, weight rows off block_n's: the masks.
    outputs, inputs = shape
    p = _int8(outputs, inputs, seed)
    x = torch.randn(batch, inputs, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(quant_gemv.rows(x, p, config), x @ _dense(p).T, rtol=1e-4, atol=1e-4)


@given(batch=st.integers(1, 1024), outputs=st.integers(1, 200_000))
def test_batch_tiles_narrow_until_the_grid_has_enough_programs(batch: int, outputs: int) -> None:
    base = batch_tiles.matmul_config(batch)
    chosen = batch_tiles.matmul_config(batch, outputs)
    # Only the weight rows per program change, to a power-of-two share of the batch's width.
    assert (chosen.block_m, chosen.block_k, chosen.warps, chosen.stages) == (
        base.block_m, base.block_k, base.warps, base.stages,
    )  # fmt: skip
    assert chosen.block_n in {base.block_n >> shift for shift in range(4)}
    narrowest = batch_tiles.NARROWEST_SMALL if batch <= 64 else 16
    assert chosen.block_n >= narrowest
    # Enough programs, or as narrow as the batch allows; never narrower than needed.
    wanted = batch_tiles.MIN_PROGRAMS
    assert -(-outputs // chosen.block_n) >= wanted or chosen.block_n == narrowest
    if chosen.block_n < base.block_n:
        assert -(-outputs // (2 * chosen.block_n)) < wanted
    # The 7B's output projection (4,096 rows): 128 programs of 32 rows at 16 rows, not 64 of 64;
    # at 128 rows 256 of 16.
    assert batch_tiles.matmul_config(16, 4096).block_n == 32
    assert batch_tiles.matmul_config(128, 4096).block_n == 16


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
    return (x.float() @ weight.T).to(x.dtype)


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
        # float32 activations: the 4-bit row kernel multiplies 16-bit ones only.
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


@given(rows=st.integers(quant_gemv.FOUR_BIT_ROWS_TAKEN + 1, 2 * quant_gemv.WIDE_TILE_ROWS))
@settings(max_examples=40, deadline=None)
def test_a_device_with_the_wide_tile_s_shared_memory_takes_it_up_to_128_rows(rows: int) -> None:
    # Marked wide (compute capability 8.0+: Capability.wide_four_bit), 4-bit batches past
    # FOUR_BIT_MATMUL_ROWS up to WIDE_TILE_ROWS take four_bit_matmul, whose tile there is
    # WIDE_TILE; unmarked (a T4, whose 64 KiB the tile passes), they dequantize. The warm-ups'
    # branches follow.
    taken: list[str] = []
    kernels = {
        "four_bit_matmul": lambda x, p, **_: taken.append("four_bit_matmul"),
        "dequantized_product": lambda x, p: taken.append("dequantized_product"),
        "four_bit_row_runs": lambda x, p: True,
    }
    plain = _nf4(64, 256, nested=True, seed=1)
    wide = replace(plain, wide_tile=True)
    x = torch.zeros(rows, 256, dtype=torch.float16)
    with pytest.MonkeyPatch.context() as patch:
        for name, stand_in in kernels.items():
            patch.setattr(quant_gemv, name, stand_in)
        quant_gemv.product(x, plain)
        quant_gemv.product(x, wide)
    small = rows <= quant_gemv.FOUR_BIT_MATMUL_ROWS
    assert taken[0] == ("four_bit_matmul" if small else "dequantized_product")
    assert taken[1] == (
        "four_bit_matmul" if rows <= quant_gemv.WIDE_TILE_ROWS else "dequantized_product"
    )
    # The start compiles past each: the wide tile is another compiled kernel than the one-block
    # tile below it (a prompt of 65 tokens must not compile it while requests wait).
    matmul = quant_gemv.FOUR_BIT_MATMUL_ROWS
    assert quant_gemv.branches(wide)[-2:] == (matmul, quant_gemv.WIDE_TILE_ROWS)
    assert quant_gemv.branches(plain)[-1] == matmul
    if not small:
        assert batch_tiles.four_bit_config(rows, 64) == batch_tiles.WIDE_TILE


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "kernel", "matmul_rows", "few"),
    [
        (1, "four_bit_row", 0, 4),
        (2, "four_bit_rows", 0, 4),
        (4, "four_bit_rows", 0, 4),
        (5, "dequantized", 0, 4),
        (5, "four_bit_matmul", 8, 4),
        (8, "four_bit_matmul", 8, 4),
        (9, "dequantized", 8, 4),
        # As shipped: one row alone takes the row kernel, two the tensor cores' product.
        (1, "four_bit_row", 8, quant_gemv.FOUR_BIT_ROWS_TAKEN),
        (2, "four_bit_matmul", 8, quant_gemv.FOUR_BIT_ROWS_TAKEN),
    ],
)
def test_a_few_16_bit_rows_of_4_bit_codes_take_the_engine_s_kernels(
    dtype: torch.dtype,
    rows: int,
    kernel: str,
    matmul_rows: int,
    few: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As on a GPU: the projection, its residual and the gated product in the 4-bit row kernel
    # for one row, the few-rows kernel up to FOUR_BIT_ROWS_TAKEN (tables read from memory here:
    # the interpreter runs no PTX), the tensor cores' kernel up to FOUR_BIT_MATMUL_ROWS where
    # set, the weight dequantized past them; bitsandbytes' GEMV or the dequantized weight where
    # the kernels cannot run.
    pytest.importorskip("bitsandbytes")  # its operators, which ``_bitsandbytes_gemv`` calls
    monkeypatch.setattr(quant_gemv, "FOUR_BIT_MATMUL_ROWS", matmul_rows)
    monkeypatch.setattr(quant_gemv, "FOUR_BIT_ROWS_TAKEN", few)
    monkeypatch.setattr(quant_gemv, "available", lambda x: True)
    monkeypatch.setattr(quant_gemv, "_gemv_4bit", _bitsandbytes_gemv)
    taken: list[str] = []

    def counted(name: str, in_registers: bool | None) -> None:
        original = getattr(quant_gemv, name)
        call = original if in_registers is None else partial(original, in_registers=False)

        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            taken.append(name)
            out: torch.Tensor = call(*args, **kwargs)
            return out

        monkeypatch.setattr(quant_gemv, name, wrapped)

    counted("four_bit_row", False)
    counted("four_bit_rows", False)
    counted("four_bit_matmul", False)
    counted("dequantized", None)
    counted("_gemv_4bit", None)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 256, generator=generator).to(dtype)
    residual = torch.randn(rows, 64, generator=generator).to(dtype)
    for nested in (False, True):
        nf4 = _nf4(64, 256, nested=nested, seed=5)
        exact = x.float() @ _dense(nf4).T
        taken.clear()
        out = project(x, nf4, residual=residual)
        torch.testing.assert_close(out.float(), residual.float() + exact, rtol=2e-2, atol=2e-2)
        gated = gated_product(x, nf4)
        torch.testing.assert_close(gated.float(), _swiglu(exact), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(quant_gemv.product(x, nf4).float(), exact, rtol=2e-2, atol=2e-2)
        assert taken == [kernel] * 3
    taken.clear()
    monkeypatch.setattr(quant_gemv, "four_bit_row_runs", lambda x, p: False)
    project(x, nf4)
    gated_product(x, nf4)
    assert taken == ["_gemv_4bit" if rows == 1 else "dequantized"] * 2


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
    p = _nested_projection(rows, blocks, torch.Generator().manual_seed(seed))
    assert p.nested is not None
    assert p.scale is not None
    expected = p.nested.maxima(p.scale).reshape(-1)
    torch.testing.assert_close(quant_gemv._maxima(p), expected, rtol=1e-6, atol=0)


def _nested_projection(rows: int, blocks: int, generator: torch.Generator) -> Linear:
    """A 4-bit projection of ``rows`` by ``32 * blocks`` bytes with random nested maxima."""
    quantized = torch.randint(0, 256, (rows, blocks), dtype=torch.uint8, generator=generator)
    groups = rows * blocks // GROUP
    nested = NestedMaxima(
        code=torch.linspace(-1, 1, 256),
        absmax=torch.rand(groups, generator=generator) + 0.5,
        offset=torch.rand(groups, generator=generator),
    )
    return Linear(
        torch.zeros(rows, 32 * blocks, dtype=torch.uint8), quantized, torch.tensor(NF4), nested
    )


@settings(max_examples=10, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.sampled_from([32, 64, 96]), st.sampled_from([8, 16])), min_size=2, max_size=4
    ),
    seed=st.integers(0, 99),
)
def test_a_layer_s_maxima_come_from_one_kernel_and_are_each_projection_s_own(
    shapes: list[tuple[int, int]], seed: int
) -> None:
    from service.engine.fast import bnb

    generator = torch.Generator().manual_seed(seed)
    # Two layers of the same projections' shapes sharing one buffer, as a model's layers do.
    layers = [[_nested_projection(r, b, generator) for r, b in shapes] for _ in range(2)]
    counts = [bnb.layer_maxima_count(layer) for layer in layers]
    assert counts[0] == counts[1] == sum(r * b for r, b in shapes)
    out = torch.full((max(c for c in counts if c is not None),), float("nan"))
    shared = [bnb.share_maxima(layer, out) for layer in layers]
    launches = 0
    kernel = quant_gemv._maxima_kernel

    class Counted:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                nonlocal launches
                launches += 1
                kernel[grid](*args, **kwargs)

            return launch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_gemv, "_maxima_kernel", Counted())
        for _ in range(2):  # one step, then the next: each layer's in the order multiplied
            for before, after in zip(layers, shared, strict=True):
                for original, taken in zip(before, after, strict=True):
                    assert original.nested is not None
                    assert original.scale is not None
                    expected = original.nested.maxima(original.scale).reshape(-1)
                    torch.testing.assert_close(
                        quant_gemv._maxima(taken), expected, rtol=1e-6, atol=0
                    )
    assert launches == 4  # one a layer a step, where there was one a projection
    for before, after in zip(layers, shared, strict=True):
        storage = after[0].scale.untyped_storage().data_ptr()  # type: ignore[union-attr]
        for original, taken in zip(before, after, strict=True):
            # The same codes and scales, as views of the layer's: nothing is held twice.
            assert torch.equal(taken.scale, original.scale)  # type: ignore[arg-type]
            assert taken.scale.untyped_storage().data_ptr() == storage  # type: ignore[union-attr]
            assert taken.nbytes() == original.nbytes()


def test_maxima_kept_otherwise_are_not_shared() -> None:
    from service.engine.fast import bnb

    generator = torch.Generator().manual_seed(0)
    nested = _nested_projection(32, 8, generator)
    other_table = _nested_projection(32, 8, generator)
    assert other_table.nested is not None
    other_table = Linear(
        other_table.weight,
        other_table.scale,
        other_table.code,
        NestedMaxima(
            other_table.nested.code * 2, other_table.nested.absmax, other_table.nested.offset
        ),
    )
    float_maxima = Linear(nested.weight, torch.rand(32, 8), nested.code)
    assert bnb.layer_maxima_count([nested, nested]) == 2 * 32 * 8
    assert bnb.layer_maxima_count([nested, other_table]) is None
    assert bnb.layer_maxima_count([nested, float_maxima]) is None


def test_the_model_s_dense_4bit_layers_share_one_maxima_buffer() -> None:
    from service.engine.fast.weights import LayerWeights, _share_layer_maxima

    generator = torch.Generator().manual_seed(1)

    def layer(rows: int, float_down: bool = False) -> LayerWeights:
        qkv, o, gate_up, down = (_nested_projection(rows, 8, generator) for _ in range(4))
        if float_down:  # maxima kept as float32: this layer keeps its own per projection
            down = Linear(down.weight, torch.rand(rows, 8), down.code)
        return LayerWeights(None, qkv, None, None, o, None, gate_up, down)

    layers = (layer(32), layer(64), layer(64, float_down=True))
    shared = _share_layer_maxima(layers)
    assert shared[2] is layers[2]
    buffers = set()
    for taken in shared[:2]:
        assert taken.gate_up is not None
        assert taken.down is not None
        projections = [taken.qkv, taken.o, taken.gate_up, taken.down]
        slices = [p.maxima for p in projections]
        assert all(s is not None for s in slices)
        assert [s.first for s in slices if s is not None] == [True, False, False, False]
        buffers.add(id(slices[0].layer.out) if slices[0] is not None else None)
    assert len(buffers) == 1  # one buffer for every layer, as long as the largest layer's
    assert shared[1].qkv.maxima is not None
    assert shared[1].qkv.maxima.layer.out.numel() == 4 * 64 * 8
