"""Decode-step kernels in isolation, each timed inside a CUDA graph: the choices behind the fast
engine's kernels for a step, measured apart from the engine.

- ``attention``: ``FlexDecode`` over a paged cache (the 7B's heads), ``rows`` rows of ``context``
  tokens each, with FlexAttention's kernel options: torch's decoding kernel and its split count,
  or its main kernel forced (``--flex`` picks among them: each compiles per batch size); and the
  engine's own ``TritonDecode`` (with Triton present) at its default splits (at least 2 pages
  each) and at 1 and 4 pages per split, with other warps and pipeline stages, and reading
  whole pages or tiles of other sizes.
- ``linear``: the 7B's projections at one row: cuBLAS in bf16, the engine's ``row_product``
  (a multiply-and-sum inductor compiles into one reduction kernel; bf16 weights, and FP8 weights
  read as they are, scaled per output row) with and without inductor's block-size tuning, and
  the FP8 ``_scaled_mm`` path the engine takes for larger batches (eager here, so its activation
  quantization runs as separate kernels).

A graph holds ``--repeat`` calls and is replayed; the figure is GPU time per call including the
gaps between kernels, which is what a decode step pays (``kernel_timing.graph_us``). On a CPU
(``--smoke``) every variant runs once at small sizes, untimed, to check that the script works.

    python -m loadtests.kernels --report kernels.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from functools import partial
from itertools import cycle
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.config
from torch.nn.attention.flex_attention import FlexKernelOptions

from service.engine.fast import gemv
from service.engine.fast.attention import DecodeAttention, FlexDecode, TritonDecode, triton_runs
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import KV_FP8, CacheShape, PagedKVCache, stored
from service.engine.fast.kernel_timing import graph_us as timed_us
from service.engine.fast.linear import fp8_linear, quantize_fp8, row_product
from service.engine.fast.pages import pages_for
from service.engine.fast.projections import swiglu
from service.engine.fast.weights import Geometry

FLEX_OPTIONS: dict[str, FlexKernelOptions | None] = {
    "default": None,
    # SPLIT_KV is read by inductor's decoding kernel but is not in the typed options.
    "split1": {"SPLIT_KV": 1},  # type: ignore[dict-item]
    "split4": {"SPLIT_KV": 4},  # type: ignore[dict-item]
    "main-kernel": {"FORCE_USE_FLEX_ATTENTION": True},
}
# (name, in, out) of the 7B: fused QKV, output, fused gate/up, down.
SHAPES = (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096))


def attention(
    rows_list: list[int],
    context: int,
    device: torch.device,
    dtype: torch.dtype,
    repeat: int,
    flex: tuple[str, ...] = tuple(FLEX_OPTIONS),
) -> dict[str, dict[str, float]]:
    heads, kv_heads, dim, page = 32, 8, 128, 128
    geometry = Geometry(
        hidden=heads * dim,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=dim,
        intermediate=4 * heads * dim,
        eps=1e-5,
        vocab=16,
        max_positions=32768,
        norm_before_rope=False,
    )
    most = max(rows_list)
    per_row = pages_for(context + 1, page)
    cache = PagedKVCache(geometry, 1, CacheShape(most * per_row + 1, page), dtype, device)
    cache.keys[0].normal_()
    cache.values[0].normal_()
    rows = DeviceRows(most, pages_for(32768, page), 16, device)
    pages = list(range(1, 1 + most * per_row))  # page 0 is the scratch page
    for row in range(most):
        mine = pages[row * per_row : (row + 1) * per_row]
        rows.set_pages([row] * per_row, list(range(per_row)), mine)
        cache.assign(mine, [row] * per_row, list(range(per_row)))
    rows.positions.fill_(context)
    rows.live.fill_(1)
    rows.lengths.fill_(context + 1)
    backends: dict[str, DecodeAttention] = {
        name: FlexDecode(cache, rows, device.type == "cuda", options)
        for name, options in FLEX_OPTIONS.items()
        if name in flex
    }
    if triton_runs(dtype, device, page):
        backends["triton"] = TritonDecode(cache, rows, geometry, most)
        for warps, stages in ((8, None), (4, 1), (4, 2), (8, 2), (2, None)):
            backends[f"triton-w{warps}-s{stages or 'default'}"] = TritonDecode(
                cache, rows, geometry, most, warps=warps, stages=stages
            )
        # Whole pages at every batch size (the kernel before tiles), and other tiles than 16.
        for tile in (page, 64, 32):
            backends[f"triton-tile{tile}"] = TritonDecode(
                cache, rows, geometry, most, tile=tile, whole_pages_up_to=0
            )
        backends["triton-page-splits"] = TritonDecode(cache, rows, geometry, most, min_pages=1)
        backends["triton-4-page-splits"] = TritonDecode(cache, rows, geometry, most, min_pages=4)
    queries = {b: torch.randn(b, heads, dim, dtype=dtype, device=device) for b in rows_list}
    results: dict[str, dict[str, float]] = {}
    reference: dict[int, torch.Tensor] = {}

    def measure(name: str, backend: DecodeAttention, over: PagedKVCache) -> None:
        results[name] = {}
        for batch, query in queries.items():
            meta = backend.prepare(batch, per_row)
            call = partial(backend, query, over.keys[0], over.values[0], meta, dim**-0.5)
            results[name][f"rows{batch}"] = timed_us(call, repeat, device)
            # How far each backend's output is from FlexAttention's default kernel.
            out = call().float()
            first = reference.setdefault(batch, out)
            results[name][f"rows{batch}_max_abs_diff"] = float((out - first).abs().max())

    for name, backend in backends.items():
        measure(name, backend, cache)
    if triton_runs(dtype, device, page):
        # The same keys and values in an 8-bit cache (``fast_kv_cache_dtype=fp8``): half the
        # bytes read; its distance from FlexAttention's 16-bit result is the cache's rounding.
        fp8 = PagedKVCache(geometry, 1, cache.shape, KV_FP8, device, compute=dtype)
        for target, source in ((fp8.keys[0], cache.keys[0]), (fp8.values[0], cache.values[0])):
            target.copy_(stored(source, KV_FP8))
        # Half the bytes did not take less time (docs/benchmarks.md, run 103): its tiles and
        # pipelining beside the default, whether more bytes in flight a program make it faster.
        shapes: dict[str, dict[str, Any]] = {
            "": {},
            "-tile32": {"tile": 32, "whole_pages_up_to": 0},
            "-tile64": {"tile": 64, "whole_pages_up_to": 0},
            "-w4-s2": {"warps": 4, "stages": 2},
            "-w8-s2": {"warps": 8, "stages": 2},
        }
        for suffix, options in shapes.items():
            kernel = TritonDecode(fp8, rows, geometry, most, **options)
            measure(f"triton-kv-fp8{suffix}", kernel, fp8)
    return results


def linear(device: torch.device, dtype: torch.dtype, repeat: int, smoke: bool) -> dict[str, Any]:
    def compiled(function: Callable[..., torch.Tensor], tuned: bool) -> Callable[..., torch.Tensor]:
        if device.type != "cuda":
            return function
        options: dict[str, str | int | bool | Callable[..., Any]] | None = (
            {"coordinate_descent_tuning": True} if tuned else None
        )
        return torch.compile(function, dynamic=False, options=options)

    reduce, tuned = compiled(row_product, False), compiled(row_product, True)
    results: dict[str, Any] = {}
    for name, inputs, outputs in SHAPES:
        if smoke:
            inputs, outputs = inputs // 64, outputs // 64
        weight = torch.randn(outputs, inputs, dtype=dtype, device=device) / inputs**0.5
        fp8 = quantize_fp8(weight)
        assert fp8.scale is not None
        scale = fp8.scale
        x = torch.randn(1, inputs, dtype=dtype, device=device)
        exact = x.float() @ weight.float().t()
        variants: dict[str, Callable[[], torch.Tensor]] = {
            "cublas": partial(torch.nn.functional.linear, x, weight),
            "reduction": partial(reduce, x, weight, None),
            "reduction-tuned": partial(tuned, x, weight, None),
            "fp8-scaled-mm": partial(fp8_linear, x, fp8.weight, scale),
            "fp8-reduction": partial(reduce, x, fp8.weight, scale),
            "fp8-reduction-tuned": partial(tuned, x, fp8.weight, scale),
        }
        if gemv.available(x):
            variants["gemv"] = partial(gemv.one_row, x, weight, None)
            variants["fp8-gemv"] = partial(gemv.one_row, x, fp8.weight, scale)
        row: dict[str, float] = {"weight_mb_bf16": round(weight.nbytes / 1e6, 1)}
        for variant, call in variants.items():
            row[f"{variant}_us"] = timed_us(call, repeat, device)
            error = (call().float() - exact).abs().max() / exact.abs().max()
            row[f"{variant}_rel_error"] = float(f"{error.item():.3g}")
        results[name] = row
    return results


# The sweep reads each weight from one of enough copies that together exceed the H200's 50 MB
# L2: every call then reads its matrix from HBM, as the engine does (the same matrix called
# again and again would be served from L2 for the smaller projections).
_COPIES_BYTES = 256 * 2**20


def _configs() -> list[gemv.GemvConfig]:
    """The sweep's block sizes: the region the first, wider sweep's winners came from, and
    slices of 2,048 and 4,096 inputs, the first at which each of 128 threads loads 16 bytes of
    an FP8 row at a time (at 1,024 a thread loads 8 bytes of FP8, 16 of bf16)."""
    configs = []
    for n in (2, 4, 8, 16):
        for k in (256, 512, 1024, 2048, 4096):
            if 512 <= n * k <= 8192:
                configs.append(gemv.GemvConfig(n, k, 4, 2))
                if n * k >= 4096:
                    configs.append(gemv.GemvConfig(n, k, 8, 2))
    return configs


def gemv_sweep(device: torch.device, repeat: int) -> dict[str, Any]:
    """Every block-size choice of ``gemv.one_row`` on the 7B's shapes as the engine calls them
    (gate/up gated, output and down with the residual added), bf16 and FP8 weights, each read
    from HBM: the fastest few per shape, to fill ``gemv.TUNED``, and cuBLAS with the same
    operations around it for comparison."""
    configs = _configs()
    report: dict[str, Any] = {"configs": len(configs)}
    for name, inputs, outputs in SHAPES:
        weight = torch.randn(outputs, inputs, dtype=torch.bfloat16, device=device) / inputs**0.5
        x = torch.randn(1, inputs, dtype=torch.bfloat16, device=device)
        gated = name == "gate_up"
        out_rows = outputs // 2 if gated else outputs
        added = name in ("o", "down")
        residual = torch.randn(1, out_rows, dtype=x.dtype, device=device) if added else None
        fused = _Fused(x, gated, residual)
        exact = fused.reference(weight.float())
        copies = max(1, -(-_COPIES_BYTES // weight.nbytes))
        plain = [weight] + [weight.clone() for _ in range(copies - 1)]
        report[f"{name}-cublas_us"] = timed_us(partial(fused.cublas, cycle(plain)), repeat, device)
        fp8 = [quantize_fp8(w) for w in plain]
        kinds = (("bf16", [(w, None) for w in plain]), ("fp8", [(q.weight, q.scale) for q in fp8]))
        for kind, weights in kinds:
            timings: list[tuple[float, gemv.GemvConfig]] = []
            for config in configs:
                call = partial(fused.gemv, cycle(weights), config)
                try:
                    timings.append((timed_us(call, repeat, device), config))
                except Exception as failure:  # a config Triton cannot build: skipped, reported
                    report.setdefault("failed", []).append(f"{config}: {failure}"[:200])
            timings.sort(key=lambda pair: pair[0])
            out = fused.gemv(iter(weights), timings[0][1]).float()
            error = (out - exact).abs().max() / exact.abs().max()
            report[f"{name}-{kind}"] = {
                "best": [dataclasses.asdict(c) | {"us": us} for us, c in timings[:4]],
                "default_us": timed_us(
                    partial(fused.gemv, cycle(weights), gemv.DEFAULT), repeat, device
                ),
                "rel_error": float(f"{error.item():.3g}"),
                "weight_bytes": weights[0][0].element_size(),
                "outputs": out_rows,
                "inputs": inputs,
                "copies": len(weights),
            }
    return report


@dataclasses.dataclass(frozen=True)
class _Fused:
    """One projection as the engine calls it: the row, the SwiGLU and the residual after it."""

    x: torch.Tensor
    gated: bool
    residual: torch.Tensor | None

    def _after(self, product: torch.Tensor) -> torch.Tensor:
        out = swiglu(product) if self.gated else product
        return out if self.residual is None else self.residual + out

    def reference(self, weight: torch.Tensor) -> torch.Tensor:
        return self._after(self.x.float() @ weight.t())

    def cublas(self, weights: Iterator[torch.Tensor]) -> torch.Tensor:
        return self._after(torch.nn.functional.linear(self.x, next(weights)))

    def gemv(
        self, weights: Iterator[tuple[torch.Tensor, torch.Tensor | None]], config: gemv.GemvConfig
    ) -> torch.Tensor:
        weight, scale = next(weights)
        return gemv.one_row(
            self.x,
            weight,
            scale,
            gated=self.gated,
            residual=self.residual,
            config=config,
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.kernels", description=__doc__)
    parser.add_argument("--rows", default="1,16,1024", help="attention batch sizes")
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument(
        "--flex",
        default=",".join(FLEX_OPTIONS),
        help="FlexAttention's variants to time (each compiles per batch size: slow)",
    )
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="CPU: small sizes, untimed")
    parser.add_argument(
        "--gemv-sweep", action="store_true", help="only the one-row kernel's block sizes (GPU)"
    )
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    if args.gemv_sweep and args.smoke:
        parser.error("--gemv-sweep times the kernel on a GPU; it has no CPU smoke run")
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    rows = [int(r) for r in args.rows.split(",")]
    with timing_context():
        report = header(device)
        if args.gemv_sweep:
            report["gemv_sweep"] = gemv_sweep(device, args.repeat)
        else:
            report["context"] = args.context
            flex = tuple(args.flex.split(","))
            report["attention_us"] = attention(rows, args.context, device, dtype, args.repeat, flex)
            report["linear_one_row"] = linear(device, dtype, args.repeat, args.smoke)
    write(report, args.report)
    return report


@contextlib.contextmanager
def timing_context() -> Iterator[None]:
    """Every batch size compiled static, as the engine's batch-1 and largest buckets are, and
    no autograd."""
    static = torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64)
    with static, torch.inference_mode():
        yield


def header(device: torch.device) -> dict[str, Any]:
    """A kernel report's first fields: the device and torch's version."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__}


def write(report: dict[str, Any], path: Path | None) -> None:
    """Print ``report`` as JSON, and write it to ``path`` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if path is not None:
        path.write_text(text)


if __name__ == "__main__":
    main()
