"""The KV cache sized again under the operator's budget: where its tensors filled free blocks that
loading left inside the allocator's segments (which the budget counted as taken), it is made
larger by what it found, and never reserves more than the first fit planned. The allocator here
is a model of the caching allocator's large pool: free blocks inside held segments take any
tensor that fits them, the rest takes segments of its own, which ``release`` gives back once
free."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.config.engine import EngineSettings
from service.engine.fast import budget, quant_gemv
from service.engine.fast.budget import Allocator, Wanted, refit
from service.engine.fast.cache import (
    KV_FP8,
    CacheShape,
    Fitted,
    fit_rows_and_pages,
    page_bytes,
)
from service.engine.fast.linear import Linear
from service.engine.fast.weights import Geometry, ModelWeights
from service.engine.loading import LoadedModel

MIB = 1 << 20
LAYERS = 4
PAGE = 2 * MIB  # bytes of one page over the layers' keys and values
WORKSPACE = 64 * MIB


@dataclass
class FakeAllocator:
    """Reserved memory: what was held before the cache, plus segments of their own for tensors
    no free block took (kept, once free, until ``release``)."""

    held: int
    holes: list[int]
    own: list[int] = field(default_factory=list)  # segments of live caches' tensors
    freed: list[int] = field(default_factory=list)  # segments free, not yet given back
    live: int = 0

    def reserved(self) -> int:
        return self.held + sum(self.own) + sum(self.freed)

    def release(self) -> None:
        self.freed.clear()

    def allocator(self) -> Allocator:
        return Allocator(reserved=self.reserved, release=self.release)


class FakeCache:
    """A cache's per-layer tensors placed as the allocator places them: the first free block
    with room, else a segment of their own."""

    def __init__(self, allocator: FakeAllocator, fitted: Fitted) -> None:
        self.allocator = allocator
        self.pages = fitted.pages
        size = fitted.pages * PAGE // (2 * LAYERS)
        self.taken: list[tuple[int, int]] = []  # (hole index, bytes)
        self.segments: list[int] = []
        for _ in range(2 * LAYERS):
            for i, room in enumerate(allocator.holes):
                if room >= size:
                    allocator.holes[i] -= size
                    self.taken.append((i, size))
                    break
            else:
                self.segments.append(size)
                allocator.own.append(size)
        allocator.live += 1

    def nbytes(self) -> int:
        return self.pages * PAGE

    def __del__(self) -> None:
        for i, size in self.taken:
            self.allocator.holes[i] += size
        for size in self.segments:
            self.allocator.own.remove(size)
            self.allocator.freed.append(size)
        self.allocator.live -= 1


def _workspace(rows: int) -> int:
    return WORKSPACE + rows * MIB


def _fit(left: int, given: int | None = None) -> Fitted:
    # As cache.fit_rows_and_pages does under a budget: the most rows (of 64, 32, 16, or those
    # given) whose cache holds two pages each once their workspace is set aside; a share of the
    # rest, whole pages.
    for rows in (64, 32, 16) if given is None else (given,):
        pages = max(2, int((left - _workspace(rows)) * 0.85) // PAGE)
        if pages >= 2 * rows:
            break
    return Fitted(rows, pages, 2048)


def _refit(allocator: FakeAllocator, left: int) -> tuple[Fitted, FakeCache]:
    # As budget.sized_cache: the second fit keeps the first's rows.
    first = _fit(left)
    return refit(
        first,
        lambda more: _fit(more, first.rows),
        lambda fitted: FakeCache(allocator, fitted),
        FakeCache.nbytes,
        allocator.allocator(),
        left,
    )


def test_a_cache_that_filled_the_load_s_free_blocks_takes_what_it_found() -> None:
    # Loading left one free block of 512 MiB inside a held segment; the first fit's 256 MiB
    # cache lands in it whole and reserves nothing more, so the cache is fitted again with
    # those 512 MiB counted as left: more pages, and what the fit set aside for the steps free
    # under the budget.
    allocator = FakeAllocator(held=1024 * MIB, holes=[512 * MIB])
    left = _workspace(32) + 302 * MIB  # 32 rows, a 256 MiB first cache
    first = _fit(left)
    fitted, cache = _refit(allocator, left)
    assert (first.rows, first.pages) == (32, 128)
    assert fitted.rows == first.rows
    assert fitted.pages > first.pages
    assert cache.pages == fitted.pages
    assert allocator.held + left - allocator.reserved() >= _workspace(fitted.rows)
    assert allocator.live == 1


def test_without_free_blocks_the_first_fit_stays() -> None:
    allocator = FakeAllocator(held=1024 * MIB, holes=[])
    left = 1024 * MIB
    fitted, cache = _refit(allocator, left)
    assert fitted == _fit(left)
    assert cache.pages == fitted.pages
    assert allocator.live == 1


@settings(max_examples=300, deadline=None)
@given(
    holes=st.lists(st.integers(0, 2048).map(lambda n: n * MIB), max_size=6),
    left_mib=st.integers(80, 4096),
)
def test_what_the_kept_fit_set_aside_for_the_steps_stays_free_under_the_budget(
    holes: list[int], left_mib: int
) -> None:
    # Whatever free blocks loading left, and however the larger tensors fall into them: the
    # first fit's rows, never fewer pages; what the kept fit set aside for the steps free under
    # the budget (held + left); one cache alive.
    allocator = FakeAllocator(held=4096 * MIB, holes=list(holes))
    left = left_mib * MIB
    first = _fit(left)
    fitted, cache = _refit(allocator, left)
    assert fitted.rows == first.rows
    assert fitted.pages >= first.pages
    assert cache.pages == fitted.pages
    if fitted != first:
        assert allocator.held + left - allocator.reserved() >= _workspace(fitted.rows)
    assert allocator.live == 1


def test_the_found_memory_buys_pages_not_rows_the_cache_cannot_fill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NF4 in 16 GiB with the 8-bit cache on an H100 (docs/benchmarks.md, runs 129-130): the
    # first fit gave 256 rows and 679 pages; its cache filled 0.434 GiB of free blocks. Fitted
    # afresh from the wanted 2,048 rows, the larger budget chose 512 rows and 553 pages, rows
    # that cache could not fill, and served fewer tokens a second. The rows stay 256; the found
    # memory buys pages.
    gib = 1 << 30
    held, hole = int(5.666 * gib), int(0.434 * gib)
    live: list[int] = []

    class Cache:
        def __init__(self, geometry: Geometry, layers: int, shape: CacheShape, *_: object) -> None:
            self.pages = shape.pages
            self.nbytes = shape.pages * page_bytes(geometry, layers, shape.page_size, KV_FP8)
            live.append(self.nbytes)

        def __del__(self) -> None:
            live.remove(self.nbytes)

    def reserved(device: object = None) -> int:
        return held + max(0, sum(live) - hole)

    monkeypatch.setattr(budget, "PagedKVCache", Cache)
    monkeypatch.setattr(budget, "cache_bytes", lambda cache: cache.nbytes)
    monkeypatch.setattr(torch.cuda, "memory_reserved", reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", reserved)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * gib, 80 * gib))
    # NF4's products: codes read up to 64 rows, a 256 MiB slice dequantized past them.
    slice_bytes = 256 << 20
    monkeypatch.setattr(quant_gemv, "branches", lambda p: (1, 4, 64))
    monkeypatch.setattr(budget, "dequantized_bytes", lambda weights, loaded: slice_bytes)
    geometry = Geometry(4096, 32, 8, 128, 14336, 1e-5, 128_167, 32_768)
    plain = Linear(torch.empty(1, 1))
    layer = SimpleNamespace(qkv=plain, o=plain, gate_up=plain, down=plain)
    weights = SimpleNamespace(
        geometry=geometry, layers=[layer] * 32, nbytes=lambda: int(4.594 * gib), lm_head=None
    )
    loaded = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float16)
    fast = EngineSettings.model_validate({"gpu_memory_gib": 16})
    wanted = Wanted(2048, 8192, KV_FP8, 2048)
    left = 16 * gib - held
    first = fit_rows_and_pages(
        geometry, 32, 128, KV_FP8, loaded.device, fast.memory_fraction, 2048, 8192,
        rows_given=False, left=left, graph_tokens=2048, dequantized=slice_bytes,
        dequantized_above=64,
    )  # fmt: skip
    fitted, cache = budget.sized_cache(
        cast(ModelWeights, weights), cast(LoadedModel, loaded), fast, wanted
    )
    assert (first.rows, first.pages) == (256, 679)
    assert fitted.rows == first.rows
    assert fitted.pages > first.pages
    assert cast(Cache, cache).pages == fitted.pages
    assert len(live) == 1
