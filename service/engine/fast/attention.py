"""Decode attention over the paged KV cache: one query per row against that row's pages.

``FlexDecode`` is FlexAttention with a block mask whose KV blocks are the row's pages (the block
size is the page size), so the kernel visits a row's own pages only; the mask function then keeps
the slots the row owns up to its length (``owner`` and ``logical`` from the cache). The mask's
tensors are fixed buffers updated in place, so the call can be captured in a CUDA graph. Compiled
on CUDA (the fused decode kernel); eager it is the unfused reference torch documents, which is what
the CPU tests run.

``TritonDecode`` is the project's own kernel (``decode_kernel.py``), first written for small
batches, where FlexAttention's three kernels per layer (the decoding kernel, the reduction of its
splits and the output's epilogue) cost more than the work: one program per row, KV head and split
reads the row's pages through the block table and attends all of the head's query heads at once;
a row of few pages is one split whose program writes the output itself, a longer one is split
over up to ``splits`` programs of at least ``min_pages`` pages each (while rows times splits stays
within ``row_splits``), and the last of them to finish combines the splits (flash-decoding) in the
same launch. In a wide batch a row is read in tiles only as far as it is written, not in whole
pages. ``SmallBatchDecode`` takes it up to a batch size (set, or measured at start:
``attention_choice.py``) and FlexAttention above.

``GatherDecode`` copies each row's pages out and runs masked SDPA: simple and exact, but its work
grows with the longest row of the batch. It serves CPUs and checks the others.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn.attention.flex_attention import BlockMask, FlexKernelOptions, flex_attention

from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import KV_FP8, PagedKVCache, read_slots
from service.engine.fast.launch import pdl_args
from service.engine.fast.weights import Geometry

# Bound at import, as ``gemv`` binds its kernel: nothing to look up inside compiled code.
_kernel: Any
try:
    from service.engine.fast.decode_kernel import paged_decode as _kernel
except ImportError:  # no Triton (a CPU build of torch)
    _kernel = None

# FlexAttention's query block size; a decode step has one query per row, so one block.
_Q_BLOCK = 128


class DecodeAttention(Protocol):
    name: str

    def prepare(self, batch: int, pages: int) -> object:
        """Per-step metadata for the first ``batch`` rows (``pages``: most pages of a row, used
        only by backends that cannot read the table as it is)."""
        ...

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: object,
        scale: float,
        pdl: bool = False,
    ) -> torch.Tensor:
        """``[batch, heads, head_dim]`` queries against one layer's cache -> the same shape
        (``pdl``: the engine's own kernel launched with programmatic dependent launch, where
        the backend has one; ``launch.py``)."""
        ...


class FlexDecode:
    name = "paged-flex"

    def __init__(
        self,
        cache: PagedKVCache,
        rows: DeviceRows,
        compiled: bool,
        kernel_options: FlexKernelOptions | None = None,
    ) -> None:
        self._cache = cache
        self._rows = rows
        self._options = kernel_options
        self._blocks = torch.zeros(rows.rows, 1, 1, dtype=torch.int32, device=rows.device)
        self._masks: dict[int, BlockMask] = {}
        self._attend = (
            torch.compile(flex_attention, fullgraph=True, dynamic=None)
            if compiled
            else _eager_flex_attention
        )

    def _mask(self, batch: int) -> BlockMask:
        mask = self._masks.get(batch)
        if mask is None:
            page = self._cache.page_size
            owner, logical, lengths = self._cache.owner, self._cache.logical, self._rows.lengths

            def keep(
                b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
            ) -> torch.Tensor:
                physical = kv // page
                position = logical[physical] * page + kv % page
                return (owner[physical] == b) & (position < lengths[b])

            mask = BlockMask.from_kv_blocks(
                self._blocks[:batch],
                self._rows.block_table[:batch].view(batch, 1, 1, -1),
                BLOCK_SIZE=(_Q_BLOCK, page),
                mask_mod=keep,
                seq_lengths=(1, self._cache.shape.slots),
                compute_q_blocks=False,
            )
            self._masks[batch] = mask
        return mask

    def prepare(self, batch: int, pages: int) -> object:
        page = self._cache.page_size
        self._blocks[:batch, 0, 0] = (self._rows.lengths[:batch] + page - 1) // page
        return self._mask(batch)

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: object,
        scale: float,
        pdl: bool = False,
    ) -> torch.Tensor:
        assert isinstance(meta, BlockMask)
        out = self._attend(
            query[:, :, None, :],
            keys[None],
            values[None],
            block_mask=meta,
            scale=scale,
            enable_gqa=True,
            kernel_options=self._options,
        )
        assert isinstance(out, torch.Tensor)
        return out[:, :, 0, :]


def triton_runs(dtype: torch.dtype, device: torch.device, page_size: int) -> bool:
    """Whether ``TritonDecode`` serves this engine when the attention is left to ``auto``:
    16-bit rows on CUDA with Triton present and pages the kernel can tile (a power of two of at
    least 16 slots). float32 keeps FlexAttention, against which the float32 fidelity is held."""
    cuda = device.type == "cuda"
    sixteen_bit = dtype in (torch.bfloat16, torch.float16)
    return cuda and _tiles(page_size) and sixteen_bit and _kernel is not None


def _tiles(size: int) -> bool:
    """Whether ``size`` slots or dims make a tile of the kernel: a power of two of at least 16
    (``tl.arange`` and ``tl.dot``)."""
    return size >= 16 and size & (size - 1) == 0


@dataclass(frozen=True, slots=True)
class _RowsTable:
    """``TritonDecode``'s metadata: none beyond what the kernel reads from the rows' buffers
    (lengths and block table), so one immutable marker serves every step."""


_ROWS_TABLE = _RowsTable()


class TritonDecode:
    name = "paged-triton"

    def __init__(
        self,
        cache: PagedKVCache,
        rows: DeviceRows,
        geometry: Geometry,
        max_batch: int,
        splits: int = 16,
        min_pages: int = 2,
        row_splits: int = 512,
        warps: int = 4,
        stages: int | None = None,
        tile: int | None = None,
        whole_pages_up_to: int = 16,
    ) -> None:
        if _kernel is None:
            raise RuntimeError("the Triton decode attention needs Triton")
        if not _tiles(cache.page_size):
            raise ValueError("the Triton decode attention needs a page size of 2^n >= 16")
        if not _tiles(geometry.head_dim):
            raise ValueError("the Triton decode attention needs a head size of 2^n >= 16")
        self._cache = cache
        self._rows = rows
        self._group = geometry.heads // geometry.kv_heads
        # tl.dot needs at least 16 rows: the head group is padded with masked lanes.
        self._group_pad = max(16, 1 << (self._group - 1).bit_length())
        self._splits = splits
        self._min_pages = min_pages
        # Slots read per iteration in batches wider than ``whole_pages_up_to`` rows: a row's
        # last page is read only up to its length, in tiles (a translation's context of some
        # 140 tokens in pages of 128 reads 144 slots, not 256); narrower batches read whole
        # pages, fewer and longer iterations for a lone row's latency. By default 16 slots
        # over a 16-bit cache and 64 over an 8-bit one, whose slots are half the bytes: each
        # measured the faster at 1,024 and 2,048 rows (docs/benchmarks.md).
        if tile is None:
            tile = 64 if cache.dtype == KV_FP8 else 16
        self._tile = min(tile, cache.page_size)
        self._whole_pages_up_to = whole_pages_up_to
        if not _tiles(self._tile) or cache.page_size % self._tile:
            raise ValueError("the attention's tile is a power of two >= 16 dividing the page")
        # Triton's launch options (``stages`` None: Triton's default), for the kernel sweep.
        self._launch = {"num_warps": warps} | ({} if stages is None else {"num_stages": stages})
        # A launch splits rows only while rows times splits stays within ``row_splits``: a wide
        # batch has programs enough without splitting, and the split buffers stay that size
        # whatever the batch.
        self._row_splits = max(row_splits, splits)
        kv_heads, dim, device = geometry.kv_heads, geometry.head_dim, rows.device
        shape = (self._row_splits, kv_heads)
        self._partial = torch.empty(*shape, self._group_pad, dim, device=device)
        self._stats = torch.empty(*shape, 2, self._group_pad, device=device)
        # Arrivals per row and KV head; the combining program sets its count back to zero.
        self._arrivals = torch.zeros(max_batch, kv_heads, dtype=torch.int32, device=device)
        self.max_batch = max_batch

    def splits_for(self, batch: int) -> int:
        """The most splits a row of a ``batch``-row launch is cut into."""
        return max(1, min(self._splits, self._row_splits // batch))

    def prepare(self, batch: int, pages: int) -> object:
        if batch > self.max_batch:
            raise ValueError(f"a batch of {batch} rows over this kernel's {self.max_batch}")
        return _ROWS_TABLE

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: object,
        scale: float,
        pdl: bool = False,
    ) -> torch.Tensor:
        query = query.contiguous()  # the kernel reads a head's dims one after the other
        batch, heads, dim = query.shape
        rows = self._rows
        out = torch.empty(batch, heads, dim, dtype=query.dtype, device=query.device)
        _kernel[(batch, keys.shape[0], self.splits_for(batch))](
            query,
            keys,
            values,
            rows.block_table,
            rows.lengths,
            out,
            self._partial,
            self._stats,
            self._arrivals,
            query.stride(0),
            query.stride(1),
            keys.stride(0),
            keys.stride(1),
            rows.block_table.stride(0),
            out.stride(0),
            out.stride(1),
            scale=scale,
            min_pages=self._min_pages,
            group=self._group,
            group_pad=self._group_pad,
            dim=dim,
            page=self._cache.page_size,
            tile=self._cache.page_size if batch <= self._whole_pages_up_to else self._tile,
            fp8_cache=keys.dtype == KV_FP8,
            **self._launch,
            **pdl_args(pdl, query.device),
        )
        return out


class SmallBatchDecode:
    """``TritonDecode`` for batches of up to its ``max_batch`` rows, FlexAttention above."""

    name = "paged-triton+flex"

    def __init__(self, small: TritonDecode, large: FlexDecode) -> None:
        self._small = small
        self._large = large

    @property
    def small_rows(self) -> int:
        """The largest batch the Triton kernel serves."""
        return self._small.max_batch

    def prepare(self, batch: int, pages: int) -> object:
        if batch <= self._small.max_batch:
            return self._small.prepare(batch, pages)
        return self._large.prepare(batch, pages)

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: object,
        scale: float,
        pdl: bool = False,
    ) -> torch.Tensor:
        if isinstance(meta, _RowsTable):
            return self._small(query, keys, values, meta, scale, pdl)
        return self._large(query, keys, values, meta, scale)


def _eager_flex_attention(*args: Any, **kwargs: Any) -> Any:
    """FlexAttention uncompiled: torch's reference implementation, which warns on every first
    call that it is unfused; here that is the point (CPU tests, the reference)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class _Gathered:
    slots: torch.Tensor
    keep: torch.Tensor
    batch: int
    width: int


class GatherDecode:
    name = "paged-gather"

    def __init__(self, cache: PagedKVCache, rows: DeviceRows) -> None:
        self._cache = cache
        self._rows = rows

    def prepare(self, batch: int, pages: int) -> object:
        page = self._cache.page_size
        table = self._rows.block_table[:batch, :pages].long()
        offsets = torch.arange(page, device=table.device)
        slots = (table[:, :, None] * page + offsets).view(-1)
        width = pages * page
        keep = torch.arange(width, device=table.device) < self._rows.lengths[:batch, None]
        return _Gathered(slots, keep[:, None, None, :], batch, width)

    def __call__(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: object,
        scale: float,
        pdl: bool = False,
    ) -> torch.Tensor:
        assert isinstance(meta, _Gathered)
        slots, keep, batch, width = meta.slots, meta.keep, meta.batch, meta.width
        shape = (-1, batch, width, query.shape[-1])
        picked_keys = read_slots(keys, slots, query.dtype).view(shape).transpose(0, 1)
        picked_values = read_slots(values, slots, query.dtype).view(shape).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, None, :],
            picked_keys,
            picked_values,
            attn_mask=keep,
            scale=scale,
            enable_gqa=True,
        )
        return out[:, :, 0, :]
