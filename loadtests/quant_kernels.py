"""Which 4-bit (and 8-bit) weight format multiplies fastest: one layer of the 7B's projections
(fused QKV, output, fused gate/up, down, in turn: together their weights pass the L2 cache, so
each is read from memory as in the engine) at a few batch sizes, each format inside a CUDA graph
(``kernel_timing.graph_us``).

- ``bf16``: cuBLAS on the 16-bit weight, the floor every format is set against;
- ``nf4`` and ``int8``: the engine's own products over bitsandbytes' numbers (``linear.linear``):
  at one row compiled, the dequantization inside the reduction that reads the packed bytes; at
  more rows dequantized into the activations' dtype, then one GEMM;
- ``nf4-bitsandbytes``: bitsandbytes' own 4-bit product (``matmul_4bit``: its GEMV kernel at
  one row, dequantize and GEMM above), what the article's fix runs, launched eagerly as
  transformers does;
- ``int4-tinygemm``: AWQ/GPTQ-style int4 (a scale and zero point per group of 128 inputs) by
  torch's own W4A16 kernel (``aten._weight_int4pack_mm``, tinygemm, compute capability 8.0+);
- ``nf4-gemv`` and ``int8-gemv``: the engine's own one-row kernels for bitsandbytes weights
  (``quant_gemv.one_row``: for NF4 ``four_bit_row``, its lookup in registers), which a lone
  request's step takes;
- ``nf4-lookup-rows``: ``quant_gemv.four_bit_rows``, each word of 4-bit codes looked up once in
  registers for 2 to ``quant_gemv.FOUR_BIT_ROWS`` rows (a step takes it up to
  ``quant_gemv.FOUR_BIT_ROWS_TAKEN``);
- ``nf4-tensor-cores`` and ``nf4-tensor-cores-nested``: ``quant_gemv.four_bit_matmul``, each
  block of 4-bit codes looked up in registers into the tensor cores' operand and its product
  scaled by the block's maximum once (a step takes it up to ``quant_gemv.matmul_rows``), with
  float32 maxima and with them double-quantized as the engine loads them (read in the loop, a
  gather each), and ``nf4-tensor-cores-float-maxima``: those dequantized by their own kernel
  first, as a step takes them; past 64 rows a slice of the kernel spans several blocks
  (``batch_tiles.four_bit_config``); ``nf4-tensor-cores-split``: the last with its programs
  split over the inputs until the grid has ``SPLIT_PROGRAMS`` (``batch_tiles.four_bit_split``);
- ``int8-rows``: the engine's own int8 batch kernel (``quant_gemv.rows``: the values straight
  into the tensor cores' product), which int8 decode batches take on a GPU (``nf4`` and ``int8``
  above 1 row are the whole-weight dequantization in torch it replaced);
- ``nf4-dequantized`` and ``int8-dequantized``: the weight dequantized whole by the engine's own
  kernel, then cuBLAS, which 4-bit codes past ``quant_gemv.FOUR_BIT_ROWS_TAKEN`` rows and int8 past
  ``quant_gemv.INT8_ROWS`` take;
- ``int4-reduction``: the same int4 numbers dequantized inside the engine's compiled one-row
  reduction (the form the engine would take for such a checkpoint at one row);
- ``nf4-engine`` and ``int8-engine``: what the engine runs for each shape
  (``projections.project``'s choice: at one row of NF4 ``four_bit_row``, of int8 the
  one-row kernel, in a CUDA graph as the engine replays it), NF4's maxima in bitsandbytes' double
  quantization as the engine loads them: the four projections' side by side, written by one
  kernel before the first;
- ``fp8``, ``fp8-fast-accum``, ``fp8-compiled``, ``fp8-gemm`` (compute capability 8.9+): the
  FP8 weights' product with each token's activations scaled and cast first (``linear.fp8_linear``)
  run eagerly, with the tensor cores' fast accumulation, compiled as the engine's step is (the
  scaling fused into the kernels around the product), and cuBLAS's product alone on activations
  cast beforehand.

Weights are random (speed does not depend on the values); each variant's result is compared with
the product over its own dequantized weight. On a CPU (``--smoke``) the engine's variants run once
at a sixteenth of the sizes, untimed.

    python -m loadtests.quant_kernels --report quant-kernels.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.config

from loadtests.kernels import SHAPES, header, timing_context, write
from service.engine.fast import batch_tiles, projections, quant_gemv
from service.engine.fast.gemv import GemvConfig
from service.engine.fast.kernel_timing import graph_us
from service.engine.fast.linear import GROUP as NESTED_GROUP
from service.engine.fast.linear import (
    Linear,
    NestedMaxima,
    dequantize,
    fp8_linear,
    linear,
    quantize_fp8,
    quantize_rows,
    scaled_product,
)

# NF4's 16 values (bitsandbytes' table).
NF4 = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362884521, 1.0,
)  # fmt: skip
BLOCK = 64  # bitsandbytes' 4-bit block
GROUP = 128  # the int4 formats' group
INNER_K_TILES = 8
# The grid ``nf4-tensor-cores-split`` splits a product's programs over its inputs to reach:
# about four programs a multiprocessor of an H100 or H200 (132).
SPLIT_PROGRAMS = 512


def _nf4(outputs: int, inputs: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    codes = torch.randint(0, 256, (outputs, inputs // 2), dtype=torch.uint8, device=device)
    maxima = torch.rand(outputs, inputs // BLOCK, device=device) / inputs**0.5
    return codes, maxima, torch.tensor(NF4, device=device)


def _int4(outputs: int, inputs: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Codes 0..15 ``[out, in]``, a scale and a zero point per group ``[out, in / GROUP]``: a
    weight is ``(code - 8) * scale + zero`` (tinygemm's convention)."""
    codes = torch.randint(0, 16, (outputs, inputs), dtype=torch.uint8, device=device)
    scales = torch.rand(outputs, inputs // GROUP, device=device) / inputs**0.5
    zeros = (torch.rand(outputs, inputs // GROUP, device=device) - 0.5) / inputs**0.5
    return codes, scales, zeros


def int4_dequantized(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    """The int4 weight as float32 ``[out, in]``."""
    out, inputs = codes.shape
    grouped = (codes.float() - 8).view(out, inputs // GROUP, GROUP)
    return (grouped * scales[:, :, None] + zeros[:, :, None]).view(out, inputs)


def int4_row(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    """One row times the int4 weight, written to compile into one reduction."""
    weight = int4_dequantized(codes, scales, zeros)
    return (x[:, None, :].float() * weight[None]).sum(-1).to(x.dtype)


def _tinygemm(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    dtype: torch.dtype,
    high_first: bool = True,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """tinygemm's product over the int4 weight (``high_first``: which code of a pair goes in a
    byte's high half; the check against the dequantized weight says which the kernel reads)."""
    first, second = codes[:, ::2], codes[:, 1::2]
    pairs = (first << 4 | second) if high_first else (second << 4 | first)
    packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), INNER_K_TILES)
    scales_and_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(dtype).contiguous()
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, scales_and_zeros)


def _bitsandbytes(
    outputs: int, inputs: int, device: torch.device, dtype: torch.dtype
) -> tuple[tuple[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]:
    """bitsandbytes' own 4-bit weight of a random matrix: its product and the weight it
    stands for."""
    import bitsandbytes.functional as bnbf
    from bitsandbytes.autograd._functions import matmul_4bit

    weight = torch.randn(outputs, inputs, dtype=dtype, device=device) / inputs**0.5
    packed, state = bnbf.quantize_4bit(weight, blocksize=BLOCK, quant_type="nf4")
    exact = bnbf.dequantize_4bit(packed, state).float()
    return (lambda x: matmul_4bit(x, packed.t(), quant_state=state),), exact


@dataclass(frozen=True)
class _Format:
    """One format's weights for the four projections of a layer, and its product."""

    product: Callable[..., torch.Tensor]
    weights: list[tuple[Any, ...]]
    exact: list[torch.Tensor]

    def layer(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.product(x, *w) for x, w in zip(xs, self.weights, strict=True)]


def _formats(device: torch.device, dtype: torch.dtype, smoke: bool) -> dict[str, _Format]:
    """Every format's weights for the 7B's layer (a sixteenth of it with ``smoke``)."""
    cuda = device.type == "cuda"
    formats: dict[str, _Format] = {
        "bf16": _Format(torch.nn.functional.linear, [], []),
        "nf4": _Format(linear, [], []),
        "int8": _Format(linear, [], []),
        "int4-reduction": _Format(int4_row, [], []),
    }
    if quant_gemv.runs(dtype, device):
        for name in ("nf4-gemv", "int8-gemv"):
            formats[name] = _Format(lambda x, p: quant_gemv.one_row(x, p), [], [])
        formats["nf4-lookup-rows"] = _Format(lambda x, p: quant_gemv.four_bit_rows(x, p), [], [])
        for name in ("nf4-tensor-cores", "nf4-tensor-cores-nested"):
            formats[name] = _Format(lambda x, p: quant_gemv.four_bit_matmul(x, p), [], [])
        formats["nf4-tensor-cores-float-maxima"] = _Format(
            partial(quant_gemv.four_bit_matmul, float_maxima=True), [], []
        )
        # The same, its programs split over the inputs to at least SPLIT_PROGRAMS.
        formats["nf4-tensor-cores-split"] = _Format(
            partial(quant_gemv.four_bit_matmul, float_maxima=True, split_programs=SPLIT_PROGRAMS),
            [],
            [],
        )
        formats["int8-rows"] = _Format(lambda x, p: quant_gemv.rows(x, p), [], [])
        for name in ("nf4-dequantized", "int8-dequantized"):
            formats[name] = _Format(_dequantized_product, [], [])
    if cuda and torch.cuda.get_device_capability(device) >= (8, 9):
        # The FP8 weights' batch product, with and without the tensor cores' fast accumulation.
        formats["fp8"] = _Format(fp8_linear, [], [])
        formats["fp8-fast-accum"] = _Format(partial(fp8_linear, fast_accum=True), [], [])
        # Compiled, as the engine's step is: the activations' scaling and cast fuse into the
        # kernels around the product (eager, they are kernels of their own: "fp8").
        formats["fp8-compiled"] = _Format(fp8_linear, [], [])
        # cuBLAS's product alone, on activations scaled and cast beforehand: the floor that
        # the two above spend their extra time over.
        formats["fp8-gemm"] = _Format(_Prequantized(), [], [])
    if cuda and not smoke:
        import bitsandbytes  # noqa: F401  (its operators, which the engine's NF4 row calls)

        for name in ("nf4-engine", "int8-engine"):
            formats[name] = _Format(lambda x, p: projections.project(x, p), [], [])
        if dtype == torch.bfloat16:  # tinygemm's one dtype
            formats["int4-tinygemm"] = _Format(lambda x, call: call(x), [], [])
        formats["nf4-bitsandbytes"] = _Format(lambda x, call: call(x), [], [])
    for _name, inputs, outputs in SHAPES:
        if smoke:
            inputs, outputs = inputs // 16, outputs // 16
        weight = torch.randn(outputs, inputs, dtype=dtype, device=device) / inputs**0.5
        codes, maxima, table = _nf4(outputs, inputs, device)
        int8 = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, device=device)
        row_max = torch.rand(outputs, 1, device=device) * 127 / inputs**0.5
        q4, scales, zeros = _int4(outputs, inputs, device)
        int4_exact = int4_dequantized(q4, scales, zeros)
        parts: dict[str, tuple[tuple[Any, ...], torch.Tensor]] = {
            "bf16": ((weight,), weight.float()),
            "nf4": ((codes, maxima, table), dequantize(codes, maxima, table, torch.float32)),
            "int8": ((int8, row_max), dequantize(int8, row_max, None, torch.float32)),
            "int4-reduction": ((q4, scales, zeros), int4_exact),
        }
        if "fp8" in formats:
            fp8 = quantize_fp8(weight)
            assert fp8.scale is not None
            exact = fp8.weight.float() * fp8.scale
            parts["fp8"] = parts["fp8-fast-accum"] = ((fp8.weight, fp8.scale), exact)
            parts["fp8-compiled"] = parts["fp8-gemm"] = parts["fp8"]
        if "nf4-gemv" in formats:
            parts["nf4-gemv"] = ((Linear(codes, maxima, table),), parts["nf4"][1])
            parts["int8-gemv"] = ((Linear(int8, row_max),), parts["int8"][1])
            parts["nf4-dequantized"] = parts["nf4-gemv"]
            parts["nf4-lookup-rows"] = parts["nf4-tensor-cores"] = parts["nf4-gemv"]
            # As the engine loads it: the maxima double-quantized.
            parts["nf4-tensor-cores-nested"] = _double_quantized(codes, maxima, table)
            parts["nf4-tensor-cores-float-maxima"] = parts["nf4-tensor-cores-nested"]
            parts["nf4-tensor-cores-split"] = parts["nf4-tensor-cores-nested"]
            parts["int8-rows"] = parts["int8-dequantized"] = parts["int8-gemv"]
        if "nf4-engine" in formats:
            parts["nf4-engine"] = _double_quantized(codes, maxima, table)
            parts["int8-engine"] = parts["int8-gemv"]
        if "int4-tinygemm" in formats:
            probe = torch.randn(16, inputs, dtype=dtype, device=device)
            for high_first in (True, False):
                tinygemm = _tinygemm(q4, scales, zeros, dtype, high_first)
                if _error(tinygemm(probe), probe, int4_exact) < 0.05:
                    break
            parts["int4-tinygemm"] = ((tinygemm,), int4_exact)
        if "nf4-bitsandbytes" in formats:
            parts["nf4-bitsandbytes"] = _bitsandbytes(outputs, inputs, device, dtype)
        for name, (held, exact) in parts.items():
            formats[name].weights.append(held)
            formats[name].exact.append(exact)
    if "nf4-engine" in formats:
        formats["nf4-engine"].weights[:] = _layer_maxima_shared(formats["nf4-engine"].weights)
    return formats


class _Prequantized:
    """``fp8_linear``'s product without its activations' quantization: each input is scaled
    and cast once, at its first call (the warm-up before the timed graph), and reused."""

    def __init__(self) -> None:
        self._inputs: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self._inputs:
            self._inputs[key] = quantize_rows(x)
        x_fp8, x_scale = self._inputs[key]
        return scaled_product(x_fp8, x_scale, weight, scale, x.dtype, x.shape[0])


def _layer_maxima_shared(weights: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The layer's four NF4 projections with their nested maxima side by side, dequantized
    by the first of them, as the engine loads a dense layer (``weights._share_layer_maxima``)."""
    from service.engine.fast import bnb

    projections = [held[0] for held in weights]
    count = bnb.layer_maxima_count(projections)
    if count is None:
        return weights
    out = torch.empty(count, dtype=torch.float32, device=projections[0].weight.device)
    return [(p,) for p in bnb.share_maxima(projections, out)]


def products(
    formats: dict[str, _Format],
    rows_list: list[int],
    device: torch.device,
    dtype: torch.dtype,
    repeat: int,
    smoke: bool,
) -> dict[str, Any]:
    """Per batch size and format: microseconds for one layer's four products in turn (their
    weights together pass the GPU's L2 cache, so each is read from memory as in the engine),
    the same times 32 layers in ms, and the largest relative error of the four."""
    cuda = device.type == "cuda"
    compiled: dict[str, Callable[..., list[torch.Tensor]]] = {}
    results: dict[str, Any] = {}
    for rows in rows_list:
        xs = [
            torch.randn(rows, inputs // (16 if smoke else 1), dtype=dtype, device=device)
            for _, inputs, _ in SHAPES
        ]
        measured: dict[str, float | str] = {}
        for name, held in formats.items():
            if name in ("int4-reduction", "nf4-gemv", "int8-gemv") and rows > 1:
                continue  # one-row forms only
            if name == "nf4-lookup-rows" and not 1 < rows <= quant_gemv.FOUR_BIT_ROWS:
                continue  # a few rows only
            layer = held.layer
            one_row_compiled = rows == 1 and name in ("nf4", "int8", "int4-reduction")
            if cuda and (one_row_compiled or name == "fp8-compiled"):
                # The engine compiles its steps: a lone row's dequantization joins the
                # reduction, a batch's activation scaling the kernels around the product.
                layer = compiled.setdefault(
                    name, torch.compile(held.layer, fullgraph=True, dynamic=False)
                )
            try:
                # bitsandbytes' kernels run eagerly, as transformers calls them (a capture
                # that failed midway would leave the stream unusable for the formats after).
                timer = _eager_us if name == "nf4-bitsandbytes" else graph_us
                layer_us = timer(partial(layer, xs), repeat, device)
                outs = layer(xs)
                errors = [_error(o, x, e) for o, x, e in zip(outs, xs, held.exact, strict=True)]
            except Exception as failure:  # one format failing leaves the others measured
                measured[f"{name}_failed"] = str(failure)[:200]
                continue
            measured[f"{name}_layer_us"] = layer_us
            measured[f"{name}_32_layers_ms"] = round(32 * layer_us / 1000, 3)
            measured[f"{name}_rel_error"] = max(errors)
        results[f"rows{rows}"] = measured
    return results


# The batch kernel's tiles tried by ``--rows-sweep`` (block_m, block_n, block_k, warps, stages):
# one stage keeps the 4-bit codes' table lookups out of the pipeliner's asynchronous copies.
SWEEP = [
    batch_tiles.MatmulConfig(*tiles)
    for tiles in (
        (16, 64, 128, 4, 1), (16, 64, 128, 4, 3), (16, 128, 128, 4, 2), (16, 64, 256, 4, 1),
        (16, 128, 256, 8, 2), (32, 64, 128, 4, 2), (64, 64, 128, 4, 1), (64, 128, 128, 8, 2),
        (128, 128, 64, 8, 3), (128, 128, 128, 8, 1), (128, 128, 128, 8, 2), (128, 256, 64, 8, 3),
        # Narrow programs, a grid that fills the GPU for 4,096-row weights (``matmul_config``).
        (16, 16, 128, 4, 3), (16, 32, 128, 4, 3), (64, 16, 128, 4, 3), (128, 32, 64, 8, 3),
        (128, 16, 64, 4, 3),
        # 4-bit slices of several blocks (``four_bit_config`` past 64 rows), a program's codes
        # serving up to all of a 256-row batch.
        (128, 64, 256, 8, 3), (128, 32, 256, 8, 3), (256, 64, 256, 8, 2), (256, 32, 256, 8, 3),
        (64, 128, 256, 4, 3), (128, 128, 256, 8, 2),
    )
]  # fmt: skip


def rows_sweep(
    formats: dict[str, _Format],
    rows_list: list[int],
    device: torch.device,
    dtype: torch.dtype,
    repeat: int,
    kinds: list[str],
) -> dict[str, Any]:
    """Per batch size, per tile configuration of ``quant_gemv.rows``: microseconds for one
    layer's four products for each of ``kinds`` (``int8-rows``, ``nf4-tensor-cores``; a
    configuration that fails is reported so)."""
    results: dict[str, Any] = {}
    for rows in rows_list:
        xs = [torch.randn(rows, inputs, dtype=dtype, device=device) for _, inputs, _ in SHAPES]
        measured: dict[str, Any] = {}
        for config in SWEEP:
            name = "-".join(map(str, (config.block_m, config.block_n, config.block_k)))
            name += f"-w{config.warps}-s{config.stages}"
            for kind in kinds:
                held = formats[kind].weights
                layer = partial(_rows_layer, xs, held, config)
                try:
                    measured[f"{name}_{kind}_us"] = graph_us(layer, repeat, device)
                except Exception as failure:  # one configuration failing leaves the others
                    measured[f"{name}_{kind}_failed"] = str(failure)[:200]
        results[f"rows{rows}"] = measured
    return results


# The one-row kernel's block sizes tried by ``--gemv-sweep`` (block_n, block_k, warps, stages).
GEMV_SWEEP = [
    GemvConfig(*sizes)
    for sizes in (
        (2, 1024, 4, 2), (4, 1024, 4, 2), (8, 1024, 4, 2), (8, 512, 4, 2), (16, 512, 4, 2),
        (16, 1024, 8, 2), (4, 2048, 8, 2), (32, 256, 4, 2),
    )
]  # fmt: skip


def gemv_sweep(
    formats: dict[str, _Format], device: torch.device, dtype: torch.dtype, repeat: int
) -> dict[str, Any]:
    """Per format (``nf4-gemv``, ``int8-gemv``), per projection of the layer (the
    gate/up one with its SwiGLU, as a lone request's step runs it), per block sizes of its
    one-row kernel: microseconds in a CUDA graph (a size that fails is reported so)."""
    results: dict[str, Any] = {}
    for kind in ("nf4-gemv", "int8-gemv"):
        measured: dict[str, Any] = {}
        for (name, inputs, _), held in zip(SHAPES, formats[kind].weights, strict=True):
            x = torch.randn(1, inputs, dtype=dtype, device=device)
            for config in GEMV_SWEEP:
                label = f"{name}-{config.block_n}-{config.block_k}-w{config.warps}"
                gated = name == "gate_up"
                call = partial(quant_gemv.one_row, x, held[0], gated=gated, config=config)
                try:
                    measured[label] = graph_us(call, repeat, device)
                except Exception as failure:  # one size failing leaves the others measured
                    measured[f"{label}_failed"] = str(failure)[:200]
        results[kind] = measured
    return results


def _double_quantized(
    codes: torch.Tensor, maxima: torch.Tensor, table: torch.Tensor
) -> tuple[tuple[Linear], torch.Tensor]:
    """The NF4 weight with its block maxima in bitsandbytes' double quantization (an 8-bit
    code each, a scale and an offset per group), and the weight it stands for."""
    flat = maxima.reshape(-1, NESTED_GROUP)
    offset = flat.mean(dim=1)
    centred = flat - offset[:, None]
    absmax = centred.abs().amax(dim=1).clamp_min(1e-12)
    steps = (centred / absmax[:, None] + 1) * 127.5
    quantized = steps.round().clamp(0, 255).to(torch.uint8).view(maxima.shape)
    nested = NestedMaxima(torch.linspace(-1, 1, 256, device=maxima.device), absmax, offset)
    exact = dequantize(codes, quantized, table, torch.float32, nested)
    return (Linear(codes, quantized, table, nested),), exact


def _dequantized_product(x: torch.Tensor, p: Linear) -> torch.Tensor:
    """The weight dequantized whole by the engine's kernel, then cuBLAS (a prefill's path)."""
    return torch.nn.functional.linear(x, quant_gemv.dequantized(p, x.dtype))


def _rows_layer(
    xs: list[torch.Tensor], held: list[tuple[Any, ...]], config: batch_tiles.MatmulConfig
) -> list[torch.Tensor]:
    """One layer's four products by the batch kernel of the weights' format (int8's, or
    ``four_bit_matmul`` for 4-bit codes) with tiles ``config``."""
    return [
        quant_gemv.rows(x, w[0], config)
        if w[0].code is None
        else quant_gemv.four_bit_matmul(x, w[0], config)
        for x, w in zip(xs, held, strict=True)
    ]


def _eager_us(call: Callable[[], object], repeat: int, device: torch.device) -> float:
    """GPU microseconds per call of ``call`` launched eagerly ``repeat`` times in a row."""
    if device.type != "cuda":
        call()
        return 0.0
    for _ in range(3):
        call()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeat):
        call()
    end.record()
    torch.cuda.synchronize(device)
    return round(1000 * float(start.elapsed_time(end)) / repeat, 2)


def _error(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """Largest difference from ``x @ weight.T`` (float32), relative to its largest value."""
    wanted = x.float() @ weight.t()
    error = (out.float() - wanted).abs().max() / wanted.abs().max()
    return float(f"{error.item():.3g}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.quant_kernels", description=__doc__)
    parser.add_argument("--rows", default="1,16,256,1024", help="batch sizes")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="CPU: small sizes, untimed")
    parser.add_argument(
        "--rows-sweep", action="store_true", help="also every tile of the batch kernel (GPU)"
    )
    parser.add_argument(
        "--sweep-formats",
        default="int8-rows,nf4-tensor-cores",
        help="the formats --rows-sweep times",
    )
    parser.add_argument(
        "--gemv-sweep", action="store_true", help="also the one-row kernel's block sizes (GPU)"
    )
    parser.add_argument("--formats", help="only these formats, comma-separated (default: all)")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float16"], help="the activations'"
    )
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    # bf16 by default: tinygemm's one dtype; float16 is the small GPUs' (issue 37's configurations).
    dtype = torch.float32 if args.smoke else getattr(torch, args.dtype)
    rows = [int(r) for r in args.rows.split(",")]
    with timing_context():
        formats = _formats(device, dtype, args.smoke)  # the weights, made once for both
        if args.formats:
            wanted = args.formats.split(",")
            formats = {name: held for name, held in formats.items() if name in wanted}
        report = header(device) | {
            "dtype": str(dtype),
            "products_us": products(formats, rows, device, dtype, args.repeat, args.smoke),
        }
        if args.rows_sweep and not args.smoke:
            wide = [r for r in rows if r > 1]
            report["rows_sweep_us"] = rows_sweep(
                formats, wide, device, dtype, 10, args.sweep_formats.split(",")
            )
        if args.gemv_sweep and not args.smoke:
            report["gemv_sweep_us"] = gemv_sweep(formats, device, dtype, args.repeat)
    write(report, args.report)
    return report


if __name__ == "__main__":
    main()
