"""Every Triton kernel of the engine passes Triton's compiler for a GPU, without one.

Triton's interpreter, which the kernels' other tests run, executes only the branches a launch
takes and checks no types; the compiler builds every statement. Three kernels that passed their
interpreter tests did not compile on the H100 (a local named like a ``constexpr`` parameter; a
helper whose untaken branch returned another shape; one name bound to an 8-bit cache's pointer and
to the queries': docs/benchmarks.md, runs 63, 68 and 101). Here each wrapper is called as the
engine calls it, in 16-bit (over an 8-bit cache too), with the launch caught instead of run, and
the launch's arguments become a signature that the compiler turns into Triton IR for a compute
capability 9.0 target; the kernels that use the tensor cores are compiled the whole way to a
cubin (Triton ships ptxas), which also says the shared memory their tiles take.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from service.engine.capability import Capability
from service.engine.fast import attention, gemv, quant_gemv, rope, slots, swiglu_fp8
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import KV_FP8, CacheShape, PagedKVCache
from service.engine.fast.gemv import GemvConfig
from service.engine.fast.linear import Linear
from service.engine.fast.pages import pages_for
from service.engine.fast.weights import Geometry
from tests.engine.test_quant_gemv import _int8, _nf4

pytest.importorskip("triton")

BF16 = torch.bfloat16
_POINTERS = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int8: "*i8",
    torch.uint8: "*u8",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.bool: "*i1",
    torch.float8_e4m3fn: "*fp8e4nv",
}
GEOMETRY = Geometry(
    hidden=256,
    heads=8,
    kv_heads=2,
    head_dim=64,
    intermediate=512,
    eps=1e-5,
    vocab=64,
    max_positions=1024,
    norm_before_rope=False,
)


class Caught:
    """Stands in for a kernel: records each launch's arguments instead of running it."""

    def __init__(self, kernel: Any) -> None:
        self.function = kernel.fn  # the Python function under Triton's decorator
        self.launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append((args, kwargs))

        return launch

    def described(self, full: bool, expect: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Each launch as the compiler takes it: the kernel's module and name, a type per
        argument, the ``constexpr`` values, its warps and stages; ``full``: compiled to a cubin,
        else to Triton IR only; ``expect``: strings its Triton IR must contain."""
        parameters = inspect.signature(self.function).parameters
        names = list(parameters)
        constexprs = {n for n, p in parameters.items() if "constexpr" in str(p.annotation)}
        described = []
        for args, kwargs in self.launches:
            bound = dict(zip(names, args, strict=False))
            bound.update({name: value for name, value in kwargs.items() if name in parameters})
            described.append(
                {
                    "module": self.function.__module__,
                    "kernel": self.function.__name__,
                    "signature": {
                        n: "constexpr" if n in constexprs else _type(bound[n]) for n in names
                    },
                    "constexprs": {n: bound[n] for n in constexprs},
                    "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs},
                    "full": full,
                    "expect": list(expect),
                }
            )
        return described


def _type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return _POINTERS[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {value!r}")


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, str], Caught]:
    def catch(module: Any, name: str) -> Caught:
        stand_in = Caught(getattr(module, name))
        monkeypatch.setattr(module, name, stand_in)
        return stand_in

    return catch


# The shared memory one block may take on an H100 or H200 (227 KiB).
SHARED_MOST = 227 * 1024
# And on the article's GPUs, by compute capability: a T4 (7.5) 64 KiB, an A10 or RTX 3090 (8.6)
# and an RTX 4090 (8.9) 99 KiB.
SMALL_GPUS = {75: 64 * 1024, 86: 99 * 1024, 89: 99 * 1024}


def _compiles(
    stand_in: Caught,
    full: bool = False,
    expect: tuple[str, ...] = (),
    arch: int = 90,
    shared_most: int = SHARED_MOST,
) -> None:
    """Every launch compiles for compute capability ``arch`` (``full``: to a cubin, within the
    ``shared_most`` bytes of shared memory a block has there), to Triton IR that contains every
    one of ``expect``."""
    assert stand_in.launches, "the wrapper launched nothing"
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    launches = [{**launch, "arch": arch} for launch in stand_in.described(full, expect)]
    finished = subprocess.run(
        [sys.executable, "-m", "tests.engine.kernel_front_end"],
        input=json.dumps(launches),
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=True,
    )
    results = json.loads(finished.stdout.splitlines()[-1])
    assert all(r.split()[0] == "ok" for r in results), "\n".join(results)
    shared = [int(r.split("=")[1]) for r in results if "shared=" in r]
    assert all(bytes_ <= shared_most for bytes_ in shared), shared


@pytest.mark.parametrize("kind", ["nf4", "nf4-nested", "int8"])
def test_the_bitsandbytes_kernels_compile(kind: str, caught: Callable[[Any, str], Caught]) -> None:
    nested = kind == "nf4-nested"
    p = _int8(128, 512, 0) if kind == "int8" else _nf4(128, 512, nested, 0)
    whole = caught(quant_gemv, "_dequantize_kernel")
    quant_gemv.dequantized(p, BF16)
    _compiles(whole)
    if kind != "int8":
        return  # 4-bit codes' rows have kernels of their own (the tests below)
    one, batch = caught(quant_gemv, "_int8_row_kernel"), caught(quant_gemv, "_int8_rows_kernel")
    x = torch.randn(1, 512, dtype=BF16)
    quant_gemv.one_row(x, p)
    quant_gemv.one_row(x, p, gated=True, residual=torch.randn(1, 64, dtype=BF16))
    for rows in (2, 20, 40, 300):  # each tile configuration
        quant_gemv.rows(torch.randn(rows, 512, dtype=BF16), p)
    _compiles(one)
    _compiles(batch, full=True)  # the tiles' shared memory, the tensor cores' layouts


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_the_four_bit_row_kernel_compiles(
    dtype: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    # The lookup's PTX goes through ptxas here: Triton's interpreter cannot run inline assembly.
    stand_in = caught(quant_gemv, "_four_bit_kernel")
    x = torch.randn(1, 512, dtype=dtype)
    for nested in (False, True):
        p = _nf4(128, 512, nested, 0)
        quant_gemv.four_bit_row(x, p)
        quant_gemv.four_bit_row(x, p, gated=True, residual=torch.randn(1, 64, dtype=dtype))
    quant_gemv.four_bit_row(x, p, config=GemvConfig(8, 512, 4, 2))
    _compiles(stand_in, full=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_four_bit_rows_kernel_compiles(
    dtype: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    # Its two pieces of PTX (the lookup, each row's products) through ptxas.
    stand_in = caught(quant_gemv, "_four_bit_rows_kernel")
    for m, nested in ((3, False), (16, True)):
        x = torch.randn(m, 512, dtype=dtype)
        p = _nf4(128, 512, nested, 0)
        quant_gemv.four_bit_rows(x, p)
        quant_gemv.four_bit_rows(x, p, gated=True, residual=torch.randn(m, 64, dtype=dtype))
    _compiles(stand_in, full=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_four_bit_matmul_kernel_compiles(
    dtype: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    # The lookup's PTX feeding the tensor cores' product (the pairs split, joined and
    # permuted into the operand's layout) through ptxas, at each tile of ``four_bit_config``
    # (a slice of one block up to 64 rows, of several past them).
    stand_in = caught(quant_gemv, "_four_bit_matmul_kernel")
    for m, nested in ((5, False), (40, True), (100, False), (100, True)):
        x = torch.randn(m, 512, dtype=dtype)
        quant_gemv.four_bit_matmul(x, _nf4(128, 512, nested, 0))
    _compiles(stand_in, full=True)


def test_the_one_row_kernel_compiles(caught: Callable[[Any, str], Caught]) -> None:
    stand_in = caught(gemv, "_kernel")
    weight = torch.randn(128, 512, dtype=BF16)
    x = torch.randn(1, 512, dtype=BF16)
    sums = torch.zeros(2, dtype=torch.float32)
    config = GemvConfig(4, 256, 4, 2)
    gemv.one_row(x, weight, None, config=config)
    gemv.one_row(x, weight, None, gated=True, residual=torch.randn(1, 64, dtype=BF16))
    gemv.one_row(
        x, weight, None, norm_eps=1e-5, norm_sum=sums[0:1], sum_into=sums[1:2], zero=sums[0:1]
    )
    scaled = Linear(weight.to(torch.float8_e4m3fn), torch.rand(128, 1))
    gemv.one_row(x, scaled.weight, scaled.scale, config=config)
    _compiles(stand_in)


@pytest.mark.parametrize(
    ("dtype", "cached"), [(BF16, BF16), (BF16, KV_FP8), (torch.float16, KV_FP8)]
)
def test_the_rope_kernel_compiles(
    dtype: torch.dtype, cached: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    # An 8-bit cache's pointers are not the queries': a name bound to both once failed here.
    stand_in = caught(rope, "_kernel")
    g = GEOMETRY
    width = (g.heads + 2 * g.kv_heads) * g.head_dim
    keys = torch.zeros(g.kv_heads, 64, g.head_dim, dtype=cached)
    norm = torch.ones(g.head_dim, dtype=dtype)
    for rows in (1, 64):  # one head a program, and several
        cos = torch.randn(rows, g.head_dim, dtype=dtype)
        slots = torch.arange(rows, dtype=torch.long)
        qkv = torch.randn(rows, width, dtype=dtype)
        rope.rope_and_store(qkv, cos, cos, norm, norm, keys, keys.clone(), slots, g)
        rope.rope_and_store(qkv, cos, cos, None, None, keys, keys.clone(), slots, g)
    _compiles(stand_in)


@pytest.mark.parametrize(
    ("dtype", "cached"), [(BF16, BF16), (BF16, KV_FP8), (torch.float16, KV_FP8)]
)
def test_the_decode_attention_compiles(
    dtype: torch.dtype, cached: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    stand_in = caught(attention, "_kernel")
    page, batch = 16, 32
    shape = CacheShape(4 * batch + 1, page)
    cache = PagedKVCache(GEOMETRY, 1, shape, cached, torch.device("cpu"), compute=dtype)
    rows = DeviceRows(batch, pages_for(GEOMETRY.max_positions, page), 16, torch.device("cpu"))
    decode = attention.TritonDecode(cache, rows, GEOMETRY, batch, min_pages=1)
    for wide in (1, batch):  # whole pages, and tiles up to each row's length
        query = torch.randn(wide, GEOMETRY.heads, GEOMETRY.head_dim, dtype=dtype)
        decode(query, cache.keys[0], cache.values[0], None, GEOMETRY.head_dim**-0.5)
    # The tensor cores' operands: the queries' dtype over a 16-bit cache; float16 over an 8-bit
    # one, which e4m3 becomes in one packed conversion (to bfloat16 it took three).
    operand = "f16" if cached == KV_FP8 else {BF16: "bf16", torch.float16: "f16"}[dtype]
    _compiles(stand_in, full=True, expect=(f"x{operand}> * tensor<",))


@pytest.mark.parametrize(
    ("dtype", "cached"), [(BF16, BF16), (BF16, KV_FP8), (torch.float16, KV_FP8)]
)
def test_the_slot_kernels_compile(
    dtype: torch.dtype, cached: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    copied, read = caught(slots, "_copy"), caught(slots, "_read")
    keys = torch.zeros(GEOMETRY.kv_heads, 64, GEOMETRY.head_dim, dtype=cached)
    picked = torch.arange(8, dtype=torch.long)
    slots.copy_slots(keys, keys.clone(), picked, picked + 8)
    slots.gather_kv(keys, keys.clone(), picked, dtype)
    _compiles(copied)
    _compiles(read)


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_the_fp8_swiglu_kernel_compiles(
    dtype: torch.dtype, caught: Callable[[Any, str], Caught]
) -> None:
    # The 7B's intermediate width (14,336: one program holds a row's 16,384-wide block).
    stand_in = caught(swiglu_fp8, "_kernel")
    swiglu_fp8.quantized(torch.zeros(20, 2 * 14336, dtype=dtype))
    _compiles(stand_in, full=True)


@pytest.mark.parametrize(("arch", "shared_most"), sorted(SMALL_GPUS.items()))
def test_the_batch_tiles_a_step_takes_fit_the_article_s_gpus(
    arch: int, shared_most: int, caught: Callable[[Any, str], Caught]
) -> None:
    # Every tile ``product`` gives its Triton batch kernels on each small card (4-bit codes past
    # FOUR_BIT_ROWS_TAKEN up to ``matmul_rows``, which is WIDE_TILE_ROWS where the card's
    # capability marks the weights for the wide tile; int8 up to INT8_ROWS), compiled for it: a
    # tile over its shared memory fails at the start's warmups there. The wide 4-bit tile (128
    # rows, 256 inputs a slice) takes 93,184 bytes on 8.x and 131,072 on 7.5.
    four_bit = caught(quant_gemv, "_four_bit_matmul_kernel")
    int8 = caught(quant_gemv, "_int8_rows_kernel")
    capability = Capability(True, divmod(arch, 10))
    weight = replace(_nf4(128, 512, True, 0), wide_tile=capability.wide_four_bit)
    most = quant_gemv.matmul_rows(weight)
    first = quant_gemv.FOUR_BIT_ROWS_TAKEN + 1
    for rows in sorted({first, 16, 32, 64, 65, most} - {0}):
        if first <= rows <= most:
            quant_gemv.four_bit_matmul(torch.randn(rows, 512, dtype=torch.float16), weight)
    for rows in sorted({2, 16, 32, 64, quant_gemv.INT8_ROWS}):
        quant_gemv.rows(torch.randn(rows, 512, dtype=torch.float16), _int8(128, 512, 0))
    for stand_in in (four_bit, int8):
        _compiles(stand_in, full=True, arch=arch, shared_most=shared_most)
