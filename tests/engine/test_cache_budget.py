"""The fast engine's KV-cache budget: the workspace a step needs is reserved before the cache
takes its share of the free memory, so a nearly full device still has room for its widest
graph."""

from __future__ import annotations

import pytest
import torch

from service.engine.fast import cache
from service.engine.fast.cache import (
    FULL_SORT_BYTES_PER_LOGIT,
    MIN_FITTED_PREFILL,
    PAGE_QUANTUM,
    ROW_TOKENS,
    SAMPLING_BYTES_PER_LOGIT,
    Fitted,
    budget_pages,
    fit_rows_and_pages,
    page_bytes,
    workspace_bytes,
)
from service.engine.fast.weights import Geometry

GEOMETRY = Geometry(
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate=14336,
    eps=1e-5,
    vocab=120_818,
    max_positions=32_768,
)
GIB = 1 << 30


def _pages(monkeypatch: pytest.MonkeyPatch, free: int, reserved: int) -> int:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 140 * GIB))
    return budget_pages(
        GEOMETRY, 32, 128, torch.bfloat16, torch.device("cuda"), 0.85, reserved=reserved
    )


def test_workspace_grows_with_rows_and_prefill_chunk() -> None:
    small = workspace_bytes(GEOMETRY, 1, 512)
    assert workspace_bytes(GEOMETRY, 1024, 512) > small
    assert workspace_bytes(GEOMETRY, 1, 8192) > small
    # The sampling buffers of 1,024 rows over a 120k vocabulary are gigabytes, not megabytes.
    assert workspace_bytes(GEOMETRY, 1024, 8192) > 5 * GIB
    # The full sort runs a slice of rows at a time: past that slice, another row adds only its
    # logits' copies, a fraction of what a sorted row takes.
    wide, wider = workspace_bytes(GEOMETRY, 1024, 0), workspace_bytes(GEOMETRY, 2048, 0)
    assert wider - wide == 1024 * GEOMETRY.vocab * SAMPLING_BYTES_PER_LOGIT
    assert SAMPLING_BYTES_PER_LOGIT < FULL_SORT_BYTES_PER_LOGIT / 2
    # A weight dequantized for a product (bitsandbytes' on a GPU) is held by the decode graphs'
    # pool, the prefill graphs' and the eager prefill's alike.
    slice_bytes = 256 * 2**20
    assert workspace_bytes(GEOMETRY, 1024, 0, 0, slice_bytes) == wide + 3 * slice_bytes
    # Not where the pool's widest step never dequantizes: int8 decode batches of up to
    # INT8_ROWS rows read the codes in their kernel, as the prefill's up to as many tokens.
    base = workspace_bytes(GEOMETRY, 128, 2048, 2048)
    for above, pools in ((None, 3), (128, 2), (2048, 0), (127, 3)):
        got = workspace_bytes(GEOMETRY, 128, 2048, 2048, slice_bytes, above)
        assert got == base + pools * slice_bytes, above


def test_reserve_comes_off_before_the_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    page = page_bytes(GEOMETRY, 32, 128, torch.bfloat16)
    reserve = workspace_bytes(GEOMETRY, 1024, 8192)
    free = 20 * GIB
    pages = _pages(monkeypatch, free, reserve)
    exact = int((free - reserve) * 0.85) // page
    assert pages == exact - exact % PAGE_QUANTUM
    assert pages < _pages(monkeypatch, free, 0)
    # What the cache leaves is at least the workspace: the widest step still fits.
    assert free - pages * page >= reserve


def test_a_little_more_or_less_free_memory_gives_the_same_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The compiled kernels are specialised to the cache's size: a restart with some megabytes
    # more or less free (here 300 MB either way) finds the same page count, hence the same
    # compiled kernels.
    page = page_bytes(GEOMETRY, 32, 128, torch.bfloat16)  # 16.8 MB: 300 MB is 15 pages of it
    free = int((PAGE_QUANTUM * 100 + PAGE_QUANTUM // 2) * page / 0.85)  # between two multiples
    counts = {_pages(monkeypatch, free + delta, 0) for delta in (-300_000_000, 0, 300_000_000)}
    assert len(counts) == 1
    assert counts.pop() % PAGE_QUANTUM == 0
    # A small device keeps what it has.
    assert _pages(monkeypatch, 10 * page, 0) == int(10 * page * 0.85) // page


def test_under_the_operator_s_budget_the_cache_takes_every_page_it_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 16 GiB budget on a larger card: the size is the same at every start already, and a
    # quantum is a gigabyte of a small cache, so nothing is rounded away.
    page = page_bytes(GEOMETRY, 32, 128, torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GIB, 80 * GIB))
    left = int((PAGE_QUANTUM * 3 + PAGE_QUANTUM // 2) * page / 0.85)
    pages = budget_pages(GEOMETRY, 32, 128, torch.bfloat16, torch.device("cuda"), 0.85, left=left)
    assert pages == int(left * 0.85) // page
    assert pages % PAGE_QUANTUM


def test_a_device_without_room_keeps_the_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _pages(monkeypatch, 2 * GIB, 8 * GIB) == 2


def test_a_cpu_sizes_the_cache_from_the_hosts_memory_and_its_rows_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cache.free_bytes(torch.device("cpu")) > 0  # what the kernel says is available
    page = page_bytes(GEOMETRY, 32, 128, torch.bfloat16)
    monkeypatch.setattr(cache, "free_bytes", lambda device: 40 * page)
    cpu = torch.device("cpu")
    assert budget_pages(GEOMETRY, 32, 128, torch.bfloat16, cpu, 0.5) == 20
    # Never more than the rows could fill at the model's longest sequence.
    assert budget_pages(GEOMETRY, 32, 128, torch.bfloat16, cpu, 0.5, most=7) == 7
    monkeypatch.setattr(cache, "free_bytes", lambda device: 10**6 * page)
    fitted = fit_rows_and_pages(GEOMETRY, 32, 128, torch.bfloat16, cpu, 0.85, 2, 16, False)
    assert fitted.rows == 2
    assert fitted.pages <= 2 * (32_768 // 128) + 1


def _fitted(
    monkeypatch: pytest.MonkeyPatch,
    free: int,
    rows: int,
    given: bool = False,
    prefill: int = 8192,
    prefill_given: bool = True,
    page_size: int = 128,
) -> Fitted:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    cuda = torch.device("cuda")
    return fit_rows_and_pages(
        GEOMETRY, 32, page_size, torch.bfloat16, cuda, 0.85, rows, prefill, given, None,
        prefill_given,
    )  # fmt: skip


def _fit(
    monkeypatch: pytest.MonkeyPatch, free: int, rows: int, given: bool = False
) -> tuple[int, int]:
    fitted = _fitted(monkeypatch, free, rows, given)
    return fitted.rows, fitted.pages


def test_a_small_card_gives_up_prefill_chunk_before_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a 24 GB card leaves after the 7B's 16-bit weights: the prefill chunk is halved to
    # its floor before the rows are, so more requests decode at once than with the chunk kept.
    kept = _fitted(monkeypatch, 9 * GIB, 1024)
    fitted = _fitted(monkeypatch, 9 * GIB, 1024, prefill_given=False)
    assert kept.prefill_tokens == 8192
    assert fitted.prefill_tokens == MIN_FITTED_PREFILL
    assert fitted.rows > kept.rows
    assert fitted.pages >= fitted.rows
    # What each fit set aside for its widest steps, as the start's log reports it (set beside
    # what the steps then took, it is how the estimate is checked on a GPU).
    for fit in (kept, fitted):
        assert fit.workspace == workspace_bytes(GEOMETRY, fit.rows, fit.prefill_tokens)
    # Where everything fits, nothing is given up.
    roomy = _fitted(monkeypatch, 100 * GIB, 1024, prefill_given=False)
    assert (roomy.rows, roomy.prefill_tokens) == (1024, 8192)


def test_rows_shrink_until_the_cache_can_fill_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Plenty of memory: the rows asked for.
    assert _fit(monkeypatch, 100 * GIB, 1024)[0] == 1024
    # Little memory: 1,024 rows' workspace leaves fewer pages than rows, so the rows halve.
    rows, pages = _fit(monkeypatch, 16 * GIB, 1024)
    assert rows < 1024
    assert pages >= rows
    # The largest halving that fits: twice as many rows would not have.
    doubled = workspace_bytes(GEOMETRY, rows * 2, 8192)
    assert _pages(monkeypatch, 16 * GIB, doubled) < rows * 2
    page = page_bytes(GEOMETRY, 32, 128, torch.bfloat16)
    assert 16 * GIB - pages * page >= workspace_bytes(GEOMETRY, rows, 8192)


def test_rows_the_operator_set_are_kept_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="HYMT_FAST_MAX_ROWS"):
        _fit(monkeypatch, 16 * GIB, 1024, given=True)
    # Not even the fewest rows fit: a start error that says what to change.
    with pytest.raises(RuntimeError, match="HYMT_FAST_NUM_PAGES"):
        _fit(monkeypatch, 3 * GIB, 1024)


def test_a_small_engine_sets_aside_a_small_full_sort() -> None:
    # The full sort's buffers are for a mode few requests ask for: an engine of 128 rows (a 16
    # GiB card's) sorts 16 at a time and sets aside an eighth of what sorting 128 would hold
    # (1.39 GiB of the 16 at a 120k vocabulary before).
    def sorted_part(rows: int) -> int:
        logits = rows * GEOMETRY.vocab * SAMPLING_BYTES_PER_LOGIT
        return workspace_bytes(GEOMETRY, rows, 0) - logits

    assert sorted_part(128) == 16 * GEOMETRY.vocab * FULL_SORT_BYTES_PER_LOGIT
    assert sorted_part(1024) == 128 * GEOMETRY.vocab * FULL_SORT_BYTES_PER_LOGIT


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_smaller_pages_buy_no_rows_the_cache_cannot_fill(
    monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    # Rows are fitted to cache tokens, not pages: with pages of 16 a page per row passed for
    # 1,024 rows of 16 tokens each, whose sampling workspace then took the cache's memory
    # (at a 16 GiB card's 6.45 GiB left, pages of 16 held 79 translations against 123).
    fitted = _fitted(monkeypatch, 9 * GIB, 1024, prefill_given=False, page_size=page_size)
    assert fitted.pages * page_size >= fitted.rows * ROW_TOKENS
    widest = _fitted(monkeypatch, 9 * GIB, 1024, prefill_given=False)
    assert fitted.rows <= widest.rows


def test_allocator_gib_reports_a_gpu_s_reserved_and_allocated_memory_and_nothing_on_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the start's log lines carry, to check the fit's workspace estimate against
    # (docs/benchmarks.md): a GPU's reserved and allocated memory in GiB, nothing on a CPU,
    # where the allocator is the host's. (The lines themselves need a GPU to carry it.)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 * 2**30 + 2**20)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * 2**30)
    expected = {"reserved_gib": 3.001, "allocated_gib": 2.0}
    assert cache.allocator_gib(torch.device("cuda")) == expected
    assert cache.allocator_gib(torch.device("cpu")) == {}
