"""bitsandbytes weights taken over by the fast engine as transformers loaded them.

transformers quantizes while it loads (``engine/quantization.py``), from a 16-bit checkpoint or
reading one saved already quantized. A ``Linear4bit``'s weight is then its 4-bit codes packed two
to a byte in the flattened order of ``[out, in]`` (the first in the high half) with a
``QuantState``: the absolute maximum of each block of ``blocksize`` inputs (itself quantized to 8
bits where ``nested``, the double quantization) and the 16 values a code stands for (NF4's or
FP4's). A ``Linear8bitLt``'s weight is int8 rows with each row's absolute maximum (``SCB``).

Here they become ``weights.Linear`` holding the same numbers: the codes as ``[out, in / 2]`` bytes
(a block never crosses a row: ``in`` is a multiple of the block), the block maxima kept in their
8-bit double quantization where its groups of 256 lie inside one layer (as they do in every
layer of the 7B; ``linear.NestedMaxima``), else dequantized once to float32 as bitsandbytes
itself does at every call, and several modules side by side
(queries, keys and values; gate and up) as one projection with their rows stacked. The engine
then dequantizes where it multiplies (``weights.dequantize``): an int8 weight meets activations in
their own 16-bit dtype (weight-only int8) instead of bitsandbytes' LLM.int8() mix of int8
products and 16-bit outlier columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from service.engine.fast.linear import GROUP, LayerMaxima, Linear, MaximaSlice, NestedMaxima


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module`` is a bitsandbytes 4-bit or int8 linear layer."""
    weight = getattr(module, "weight", None)
    return hasattr(weight, "quant_state") or hasattr(weight, "SCB")


def projection(modules: Sequence[nn.Module]) -> Linear:
    """The bitsandbytes layers ``modules`` as one projection, their output rows in order."""
    parts = [_linear(module) for module in modules]
    codes = [part.code for part in parts]
    if not (all(c is None for c in codes) or all(_same(c, codes[0]) for c in codes)):
        raise RuntimeError("layers fused into one projection are quantized alike")
    weight = torch.cat([part.weight for part in parts]).contiguous()
    nested = [part.nested for part in parts if part.nested is not None]
    if nested and len(nested) == len(parts) and all(_same(n.code, nested[0].code) for n in nested):
        maxima = NestedMaxima(
            nested[0].code,
            torch.cat([n.absmax for n in nested]),
            torch.cat([n.offset for n in nested]),
        )
        return Linear(weight, torch.cat([_scale(p) for p in parts]), codes[0], maxima)
    # The maxima of parts kept differently are stacked as float32.
    scales = [_scale(part) if part.nested is None else _float_maxima(part) for part in parts]
    return Linear(weight, torch.cat(scales).contiguous(), codes[0])


def layer_maxima_count(projections: Sequence[Linear]) -> int | None:
    """The block maxima of a layer's projections if ``share_maxima`` can put them side by side
    (every one 4-bit, its maxima nested in whole groups, one table of 8-bit values), else
    None."""
    counted, code = 0, _first_code(projections)
    for p in projections:
        n = p.nested
        if n is None or p.scale is None or not _same(n.code, code):
            return None
        if p.scale.numel() != n.absmax.numel() * GROUP:
            return None
        counted += p.scale.numel()
    return counted or None


def share_maxima(projections: Sequence[Linear], out: torch.Tensor) -> list[Linear]:
    """``projections``, a layer's in the order a step multiplies them (``layer_maxima_count``
    says they can), with their maxima side by side in one ``LayerMaxima`` writing into ``out``:
    their codes and scales become views of the layer's, so nothing is held twice."""
    nested = [p.nested for p in projections]
    code = _first_code(projections)
    assert code is not None
    assert all(n is not None for n in nested)
    quantized = torch.cat([_scale(p).reshape(-1) for p in projections])
    shared = NestedMaxima(
        code,
        torch.cat([n.absmax for n in nested if n is not None]),
        torch.cat([n.offset for n in nested if n is not None]),
    )
    if quantized.numel() > out.numel():
        raise ValueError("the layers' maxima buffer is shorter than this layer's maxima")
    layer = LayerMaxima(quantized, shared, out)
    taken: list[Linear] = []
    start = groups = 0
    for index, p in enumerate(projections):
        count = _scale(p).numel()
        own = count // GROUP
        taken.append(
            dataclasses.replace(
                p,
                scale=quantized[start : start + count].view(_scale(p).shape),
                nested=NestedMaxima(
                    shared.code,
                    shared.absmax[groups : groups + own],
                    shared.offset[groups : groups + own],
                ),
                maxima=MaximaSlice(layer, start, count, first=index == 0),
            )
        )
        start, groups = start + count, groups + own
    return taken


def _first_code(projections: Sequence[Linear]) -> torch.Tensor | None:
    nested = projections[0].nested
    return None if nested is None else nested.code


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and torch.equal(a, b)


def _scale(part: Linear) -> torch.Tensor:
    assert part.scale is not None
    return part.scale


def _float_maxima(part: Linear) -> torch.Tensor:
    """A 4-bit part's nested block maxima as float32 (what bitsandbytes computes each call)."""
    assert part.nested is not None
    return part.nested.maxima(_scale(part))


def _linear(module: Any) -> Linear:
    weight = module.weight
    out, inputs = int(module.out_features), int(module.in_features)
    state = getattr(weight, "quant_state", None)
    if state is not None:
        return _four_bit(weight.data, state, out, inputs)
    # A layer that has run moved its rows and scales into its matmul state (``init_8bit_state``).
    moved = getattr(module, "state", None)
    row_max = getattr(weight, "SCB", None)
    if row_max is None:
        row_max = getattr(moved, "SCB", None)
    rows = weight.data if weight.dtype == torch.int8 else getattr(moved, "CB", None)
    if row_max is None or rows is None or rows.dtype != torch.int8:
        raise RuntimeError("an int8 bitsandbytes layer without its rows or their scales (SCB)")
    return Linear(rows.view(out, inputs), row_max.float().view(out, 1))


def _four_bit(packed: torch.Tensor, state: Any, out: int, inputs: int) -> Linear:
    block = int(state.blocksize)
    if tuple(state.shape) != (out, inputs) or inputs % block or block % 2:
        raise RuntimeError(
            f"a 4-bit layer of shape {tuple(state.shape)} in blocks of {block}: the fast engine "
            "reads blocks that never cross a row"
        )
    codes = packed.view(torch.uint8).view(out, inputs // 2)
    code = state.code.float().to(codes.device)
    blocks = inputs // block
    if state.nested and out * blocks % GROUP == 0 and int(state.state2.blocksize) == GROUP:
        # Kept 8-bit: each group of maxima lies inside this layer, so layers stack whole groups.
        groups = out * blocks // GROUP
        nested = NestedMaxima(
            state.state2.code.float().to(codes.device),
            state.state2.absmax.float().view(groups),
            torch.full((groups,), float(state.offset), device=codes.device),
        )
        return Linear(codes, state.absmax.view(out, blocks), code, nested)
    absmax = state.absmax
    if state.nested:
        # Imported only for quantized weights (bitsandbytes logs on import).
        from bitsandbytes.functional import dequantize_blockwise

        absmax = dequantize_blockwise(absmax, state.state2) + state.offset
    return Linear(codes, absmax.float().view(out, blocks).contiguous(), code)
