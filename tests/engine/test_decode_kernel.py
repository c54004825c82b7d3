"""The Triton decode attention (``TritonDecode``) against the gathered reference, in Triton's
interpreter: rows of one page, of page boundaries, of several splits combined in the launch,
rows without a request, and pages scattered over the cache."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask

from service.engine.fast.attention import FlexDecode, GatherDecode, SmallBatchDecode, TritonDecode
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import KV_FP8, CacheShape, PagedKVCache, write_kv
from service.engine.fast.pages import pages_for
from service.engine.fast.weights import Geometry

pytest.importorskip("triton")

PAGE = 16
GEOMETRY = Geometry(
    hidden=128,
    heads=8,
    kv_heads=2,
    head_dim=16,
    intermediate=64,
    eps=1e-5,
    vocab=16,
    max_positions=512,
    norm_before_rope=False,
)
# Lengths: one partial page, one full page, a row split twice, no request, a row split 4 times.
LENGTHS = [5, 16, 70, 0, 200]


def _filled(lengths: list[int], page: int = PAGE) -> tuple[PagedKVCache, DeviceRows]:
    torch.manual_seed(0)
    needed = sum(pages_for(n, page) for n in lengths)
    cache = PagedKVCache(
        GEOMETRY, 1, CacheShape(needed + 8, page), torch.float32, torch.device("cpu")
    )
    cache.keys[0].normal_()
    cache.values[0].normal_()
    rows = DeviceRows(len(lengths), pages_for(512, page), 16, torch.device("cpu"))
    free = list(range(1, needed + 8))
    random.Random(0).shuffle(free)  # a row's pages are anywhere in the cache
    for row, length in enumerate(lengths):
        mine = [free.pop() for _ in range(pages_for(length, page))]
        if mine:
            rows.set_pages([row] * len(mine), list(range(len(mine))), mine)
            cache.assign(mine, [row] * len(mine), list(range(len(mine))))
    rows.lengths.copy_(torch.tensor(lengths, dtype=torch.int32))
    return cache, rows


@pytest.mark.parametrize("row_splits", [512, 10, 5])
def test_kernel_equals_the_gathered_attention(row_splits: int) -> None:
    # row_splits: a launch of 5 rows split 4 ways (512), 2 ways (10), or not at all (5).
    cache, rows = _filled(LENGTHS)
    batch = len(LENGTHS)
    query = torch.randn(batch, GEOMETRY.heads, GEOMETRY.head_dim)
    scale = GEOMETRY.head_dim**-0.5
    kernel = TritonDecode(
        cache, rows, GEOMETRY, max_batch=batch, splits=4, min_pages=2, row_splits=row_splits
    )
    assert kernel.splits_for(batch) == {512: 4, 10: 2, 5: 1}[row_splits]
    gather = GatherDecode(cache, rows)
    most = max(pages_for(n, PAGE) for n in LENGTHS)
    expected = gather(query, cache.keys[0], cache.values[0], gather.prepare(batch, most), scale)
    meta = kernel.prepare(batch, most)
    # The second launch finds the arrival counts reset by the first; the third is launched as
    # HYMT_FAST_PDL launches it (the interpreter takes the option, not CUDA's wait).
    for pdl in (False, False, True):
        out = kernel(query, cache.keys[0], cache.values[0], meta, scale, pdl)
        live = [row for row, n in enumerate(LENGTHS) if n]
        torch.testing.assert_close(out[live], expected[live], atol=1e-5, rtol=1e-5)
        assert torch.equal(out[3], torch.zeros_like(out[3]))  # the row without a request
        assert int(kernel._arrivals.abs().sum()) == 0


@pytest.mark.parametrize("splits", [1, 4])
def test_pages_read_in_tiles_up_to_the_length_give_the_same_attention(splits: int) -> None:
    # Pages of 64 slots read 16 at a time, only as far as each row is written (lengths inside
    # a tile, at a tile's end, at a page's end, past a page), alone and split.
    lengths = [5, 16, 70, 0, 200, 64, 129]
    cache, rows = _filled(lengths, page=64)
    batch = len(lengths)
    query = torch.randn(batch, GEOMETRY.heads, GEOMETRY.head_dim)
    scale = GEOMETRY.head_dim**-0.5
    kernel = TritonDecode(
        cache, rows, GEOMETRY, batch, splits=splits, min_pages=1, tile=16, whole_pages_up_to=0
    )
    gather = GatherDecode(cache, rows)
    most = max(pages_for(n, 64) for n in lengths)
    expected = gather(query, cache.keys[0], cache.values[0], gather.prepare(batch, most), scale)
    out = kernel(query, cache.keys[0], cache.values[0], kernel.prepare(batch, most), scale)
    live = [row for row, n in enumerate(lengths) if n]
    torch.testing.assert_close(out[live], expected[live], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="tile"):
        TritonDecode(cache, rows, GEOMETRY, batch, tile=24)


def test_small_batches_take_the_kernel_and_larger_ones_flex() -> None:
    cache, rows = _filled(LENGTHS)
    small = TritonDecode(cache, rows, GEOMETRY, max_batch=2)
    routed = SmallBatchDecode(small, FlexDecode(cache, rows, compiled=False))
    query = torch.randn(len(LENGTHS), GEOMETRY.heads, GEOMETRY.head_dim)
    scale = GEOMETRY.head_dim**-0.5
    for batch in (2, 3):
        gather = GatherDecode(cache, rows)
        expected = gather(
            query[:batch], cache.keys[0], cache.values[0], gather.prepare(batch, 5), scale
        )
        meta = routed.prepare(batch, 5)
        assert isinstance(meta, BlockMask) == (batch > 2)
        out = routed(query[:batch], cache.keys[0], cache.values[0], meta, scale)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="over this kernel"):
        small.prepare(3, 5)


@pytest.mark.parametrize(("page", "whole_pages_up_to"), [(PAGE, 16), (128, 0)])
def test_an_8_bit_cache_is_read_as_the_gathered_attention_reads_it(
    page: int, whole_pages_up_to: int
) -> None:
    # fast_kv_cache_dtype=fp8: the kernel converts each tile of keys and values, and the
    # queries, to float16 for the tensor cores (every e4m3 value is exact there), as the
    # gathering attention converts the slots it picks: the same attention, of float16 queries,
    # within float16's rounding of the softmax weights. Whole pages, and pages of 128 read in
    # the 8-bit cache's default tiles of 64 slots as far as each row is written.
    cache, rows = _filled(LENGTHS, page=page)
    fp8 = PagedKVCache(GEOMETRY, 1, cache.shape, KV_FP8, torch.device("cpu"), compute=torch.float32)
    slots = torch.arange(cache.shape.slots)
    write_kv(fp8.keys[0], fp8.values[0], slots, cache.keys[0][:, slots].transpose(0, 1),
             cache.values[0][:, slots].transpose(0, 1))  # fmt: skip
    assert fp8.keys[0].dtype == KV_FP8
    batch = len(LENGTHS)
    query = torch.randn(batch, GEOMETRY.heads, GEOMETRY.head_dim)
    scale = GEOMETRY.head_dim**-0.5
    most = max(pages_for(n, page) for n in LENGTHS)
    gather = GatherDecode(fp8, rows)
    meta = gather.prepare(batch, most)
    expected = gather(query.half().float(), fp8.keys[0], fp8.values[0], meta, scale)
    exact = gather(query, cache.keys[0], cache.values[0], gather.prepare(batch, most), scale)
    kernel = TritonDecode(
        fp8, rows, GEOMETRY, batch, splits=4, min_pages=1, whole_pages_up_to=whole_pages_up_to
    )
    out = kernel(query, fp8.keys[0], fp8.values[0], kernel.prepare(batch, most), scale)
    live = [row for row, n in enumerate(LENGTHS) if n]
    torch.testing.assert_close(out[live], expected[live], atol=2e-3, rtol=2e-3)
    # And 8 bits (3 of mantissa: a value within 1/16 of itself) away from the full-precision
    # cache's attention, not further (outputs of about 1 here: seeded, normal keys and values).
    assert (out[live] - exact[live]).abs().max() < 0.15
    assert not torch.equal(out[live], exact[live])
