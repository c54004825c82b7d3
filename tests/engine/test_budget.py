"""The KV cache sized again under the operator's budget: where its tensors filled free blocks that
loading left inside the allocator's segments (which the budget counted as taken), it is made
larger by what it found, and never reserves more than the first fit planned. The allocator here
is a model of the caching allocator's large pool: free blocks inside held segments take any
tensor that fits them, the rest takes segments of its own, which ``release`` gives back once
free."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast.budget import Allocator, refit
from service.engine.fast.cache import Fitted

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


def _fit(left: int) -> Fitted:
    # As cache.fit_rows_and_pages does under a budget: the workspace set aside, a share of the
    # rest, whole pages.
    return Fitted(16, max(2, int((left - WORKSPACE) * 0.85) // PAGE), 2048)


def _refit(allocator: FakeAllocator, left: int) -> tuple[Fitted, FakeCache]:
    return refit(
        _fit(left),
        _fit,
        lambda fitted: FakeCache(allocator, fitted),
        FakeCache.nbytes,
        allocator.allocator(),
        left,
    )


def test_a_cache_that_filled_the_load_s_free_blocks_takes_what_it_found() -> None:
    # Loading left one free block of 512 MiB inside a held segment; the first fit's 256 MiB
    # cache lands in it whole and reserves nothing more, so the cache is made again with those
    # 512 MiB counted as left: what the budget holds stays what the first fit planned.
    allocator = FakeAllocator(held=1024 * MIB, holes=[512 * MIB])
    left = 64 * MIB + 302 * MIB  # a 256 MiB first cache
    first = _fit(left)
    planned = allocator.held + first.pages * PAGE
    fitted, cache = _refit(allocator, left)
    assert first.pages == 128
    assert fitted.pages > first.pages
    assert cache.pages == fitted.pages
    assert allocator.reserved() <= planned
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
def test_the_cache_never_reserves_more_than_the_first_fit_planned(
    holes: list[int], left_mib: int
) -> None:
    # Whatever free blocks loading left, and however the larger tensors fall into them: never
    # fewer pages than the first fit, never more reserved than it planned, one cache alive.
    allocator = FakeAllocator(held=4096 * MIB, holes=list(holes))
    left = left_mib * MIB
    first = _fit(left)
    planned = allocator.held + first.pages * PAGE
    fitted, cache = _refit(allocator, left)
    assert fitted.pages >= first.pages
    assert cache.pages == fitted.pages
    assert allocator.reserved() <= planned
    assert allocator.live == 1
    # The budget's rows and prefill chunk are the fit's own, whichever cache is kept.
    assert (fitted.rows, fitted.prefill_tokens) == (first.rows, first.prefill_tokens)
