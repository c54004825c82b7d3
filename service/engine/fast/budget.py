"""How much of the device the fast engine's KV cache takes: the operator's memory budget
(``gpu_memory_gib``) checked against the loaded weights, the fit of decode rows, pages and
prefill chunk (``cache.fit_rows_and_pages``), and the cache allocated, then sized again where its
tensors filled free blocks that loading left inside the allocator's segments.

The budget counts what the allocator reserves. After a quantizing load the reserved memory
includes free blocks of segments that still hold some weights (the 16-bit tensors a
quantization replaced); ``empty_cache`` cannot give those back, so the fit counts them as taken.
The cache's per-layer tensors are small enough to land in them, which leaves that much of the
budget unused: the cache is measured once allocated and, where it took less than it counted,
fitted and allocated again with what it found, kept only where what the fit set aside for the
steps is then free under the budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from service.config.engine import EngineSettings
from service.engine.fast import quant_gemv
from service.engine.fast.cache import (
    CacheShape,
    Fitted,
    PagedKVCache,
    allocator_gib,
    fit_rows_and_pages,
)
from service.engine.fast.weights import ModelWeights
from service.engine.loading import LoadedModel

log = logging.getLogger(__name__)

C = TypeVar("C")

# Shares of the found memory a second fit tries, largest first: larger per-layer tensors may no
# longer fit the free blocks the first cache's did, and a smaller step of growth may.
REFIT_SHARES = (1.0, 0.5, 0.25)


@dataclass(frozen=True, slots=True)
class Wanted:
    """What the engine's plan asks of the cache before it is fitted to the device."""

    rows: int
    prefill_tokens: int
    kv_dtype: torch.dtype
    # The largest prefill step run as a CUDA graph (its pool is set aside).
    prefill_graph_tokens: int


@dataclass(frozen=True, slots=True)
class Allocator:
    """The device allocator's figures the second fit reads, and its release of free segments
    (a GPU's; tests give their own)."""

    reserved: Callable[[], int]
    release: Callable[[], None]


def cuda_allocator(device: torch.device) -> Allocator:
    return Allocator(
        reserved=lambda: torch.cuda.memory_reserved(device),
        release=torch.cuda.empty_cache,
    )


def budget_left(weights: ModelWeights, loaded: LoadedModel, fast: EngineSettings) -> int | None:
    """Bytes of the operator's budget left once the weights are in (None: no budget); refused
    where the weights alone pass it."""
    if fast.memory_gib is None:
        return None
    budget = int(fast.memory_gib * 2**30)
    device = loaded.device
    if device.type == "cuda":
        # What loading left cached (a quantization's temporaries) goes back first: the budget
        # counts what the engine holds, and the cache is sized from what is left.
        torch.cuda.empty_cache()
    used = torch.cuda.memory_reserved(device) if device.type == "cuda" else weights.nbytes()
    if used >= budget:
        raise RuntimeError(
            f"the weights take {used / 2**30:.2f} GiB, more than HYMT_GPU_MEMORY_GIB="
            f"{fast.memory_gib:g} leaves for them and a KV cache: quantize them "
            "(HYMT_QUANTIZATION=nf4, int8 or fp8) or raise the budget"
        )
    left = budget - used
    log.info(
        "memory budget",
        extra={
            "budget_gib": round(budget / 2**30, 3),
            # Held after loading beside the weights: what the budget loses before the cache (a
            # quantization's leftovers, the allocator's partly used segments).
            "held_gib": round(used / 2**30, 3),
            "weights_gib": round(weights.nbytes() / 2**30, 3),
            "left_gib": round(left / 2**30, 3),
            **allocator_gib(device),
        },
    )
    return left


def sized_cache(
    weights: ModelWeights, loaded: LoadedModel, fast: EngineSettings, wanted: Wanted
) -> tuple[Fitted, PagedKVCache]:
    """Rows, pages and prefill chunk for this device and budget, and the cache allocated: as
    set (``fast_num_pages``), or what fits the device's free memory and the operator's budget
    once the weights are in."""
    geometry, layers, device = weights.geometry, len(weights.layers), loaded.device

    def make(fitted: Fitted) -> PagedKVCache:
        shape = CacheShape(fitted.pages, fast.page_size)
        return PagedKVCache(geometry, layers, shape, wanted.kv_dtype, device, loaded.dtype)

    if fast.num_pages:
        fitted = Fitted(wanted.rows, fast.num_pages, wanted.prefill_tokens)
        return fitted, make(fitted)
    dequantized = dequantized_bytes(weights, loaded)
    above = max(quant_gemv.branches(weights.layers[0].qkv), default=None)

    def fit(left: int | None, rows: int, prefill: int, given: bool = False) -> Fitted:
        return fit_rows_and_pages(
            geometry,
            layers,
            fast.page_size,
            wanted.kv_dtype,
            device,
            fast.memory_fraction,
            rows,
            prefill,
            rows_given=given or fast.max_rows is not None,
            left=left,
            prefill_given=given or fast.prefill_tokens is not None,
            graph_tokens=wanted.prefill_graph_tokens,
            dequantized=dequantized,
            dequantized_above=above,
        )

    left = budget_left(weights, loaded, fast)
    first = fit(left, wanted.rows, wanted.prefill_tokens)
    if left is None or device.type != "cuda":
        return first, make(first)

    # The memory found goes to pages; the rows and prefill chunk stay the first fit's. Fitted
    # afresh, a larger budget can buy twice the rows with fewer pages, rows a cache of that
    # size cannot fill (a page holds 128 tokens, a translation takes two): NF4 in 16 GiB then
    # ran no more requests at once, in larger graphs, and fewer tokens a second
    # (docs/benchmarks.md, run 130).
    def more(left: int) -> Fitted:
        return fit(left, first.rows, first.prefill_tokens, given=True)

    return refit(first, more, make, cache_bytes, cuda_allocator(device), left)


def cache_bytes(cache: PagedKVCache) -> int:
    """Bytes of the cache's keys and values."""
    return sum(t.nelement() * t.element_size() for t in (*cache.keys, *cache.values))


def refit(
    first: Fitted,
    fit: Callable[[int], Fitted],
    make: Callable[[Fitted], C],
    nbytes: Callable[[C], int],
    allocator: Allocator,
    left: int,
) -> tuple[Fitted, C]:
    """``first``'s cache made, and made again larger where it reserved less than its bytes (it
    filled free blocks the fit counted as taken): fitted with that much more of the budget
    ``left``, kept only if it gives more pages (or rows) and finds in free blocks at least what
    it was credited, so that what the fit set aside for the steps is free under the budget;
    else a smaller share of the found memory is tried (``REFIT_SHARES``), and at last the first
    fit again."""
    before = allocator.reserved()
    cache = make(first)
    found = before + nbytes(cache) - allocator.reserved()
    if found <= 0:
        return first, cache
    # The first cache goes back before a second is fitted: on a card the budget nearly fills,
    # the device's free memory (which the fit reads too) counts it otherwise.
    del cache
    allocator.release()
    for share in REFIT_SHARES:
        credited = int(found * share)
        second = fit(left + credited)
        if (second.rows, second.pages) <= (first.rows, first.pages):
            break
        bigger = make(second)
        if allocator.reserved() <= before + nbytes(bigger) - credited:
            log.info(
                "kv cache sized again",
                extra={
                    "rows": second.rows,
                    "pages": second.pages,
                    "first_rows": first.rows,
                    "first_pages": first.pages,
                    "found_gib": round(found / 2**30, 3),
                    "credited_gib": round(credited / 2**30, 3),
                },
            )
            return second, bigger
        del bigger
        allocator.release()
    return first, make(first)


def dequantized_bytes(weights: ModelWeights, loaded: LoadedModel) -> int:
    """The largest bitsandbytes weight the products dequantize at once on this device."""
    if not quant_gemv.runs(loaded.dtype, loaded.device):
        return 0
    layer = weights.layers[0]
    projections = (layer.qkv, layer.o, layer.gate_up, layer.down, weights.lm_head)
    return quant_gemv.dequantized_bytes([p for p in projections if p is not None], loaded.dtype)
