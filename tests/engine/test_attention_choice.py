"""Choosing up to which batch the Triton decode attention serves: the search over the buckets
(any threshold, found with few measurements), the bound where FlexAttention wins, and the timing
leaving the idle engine's rows and cache as they were."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from service.engine.fast.attention import TritonDecode
from service.engine.fast.attention_choice import (
    MEASURED_ABOVE,
    AttentionTimer,
    largest_passing,
    measured_triton_rows,
)
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import CacheShape, PagedKVCache
from service.engine.fast.graphs import buckets_up_to
from service.engine.fast.pages import pages_for
from tests.engine.test_decode_kernel import GEOMETRY


@given(
    candidates=st.lists(st.integers(1, 4096), unique=True, max_size=20).map(sorted),
    threshold=st.integers(0, 5000),
)
def test_the_search_finds_the_last_size_that_passes_in_few_measurements(
    candidates: list[int], threshold: int
) -> None:
    asked: list[int] = []

    def passes(size: int) -> bool:
        asked.append(size)
        return size <= threshold

    wanted = max((c for c in candidates if c <= threshold), default=None)
    assert largest_passing(candidates, passes) == wanted
    # The widest first (one measurement where every size passes), then halves.
    assert len(asked) <= 1 + max(1, len(candidates)).bit_length()
    assert len(set(asked)) == len(asked)
    if candidates:
        assert asked[0] == candidates[-1]


class _Losing:
    """A timer at which FlexAttention always wins."""

    def __init__(self) -> None:
        self.timings: dict[int, tuple[float, float]] = {}
        self.asked: list[int] = []

    def fits(self, batch: int) -> bool:
        return batch <= 512

    def triton_wins(self, batch: int) -> bool:
        self.asked.append(batch)
        return False


def test_where_flex_wins_the_kernel_keeps_the_sizes_it_won_at_everywhere() -> None:
    losing = _Losing()
    assert measured_triton_rows(losing, buckets_up_to(1024)) == MEASURED_ABOVE  # type: ignore[arg-type]
    # Only sizes above the floor that the cache can hold were timed.
    assert all(MEASURED_ABOVE < b <= 512 for b in losing.asked)
    assert measured_triton_rows(_Losing(), buckets_up_to(8)) == 8  # type: ignore[arg-type]


def test_timing_leaves_the_rows_and_the_cache_as_it_found_them() -> None:
    pytest.importorskip("triton")
    cpu = torch.device("cpu")
    geometry = GEOMETRY
    cache = PagedKVCache(geometry, 1, CacheShape(12, 16), torch.float32, cpu)
    rows = DeviceRows(4, pages_for(512, 16), 16, cpu)
    triton = TritonDecode(cache, rows, geometry, 4)
    timer = AttentionTimer(cache, rows, geometry, triton, context=20, compiled=False)
    assert timer.fits(4)
    assert not timer.fits(8)  # two pages a row: 16 pages and the scratch page
    assert timer.time(4) == (0.0, 0.0)  # nothing is timed on a CPU; both kernels ran
    assert int(rows.block_table.abs().sum()) == 0
    assert int(rows.lengths.abs().sum()) == 0
    assert bool((cache.owner == -1).all())
