"""Decode attention over the paged KV cache: one query per row against that row's pages.

``FlexDecode`` is FlexAttention with a block mask whose KV blocks are the row's pages (the block
size is the page size), so the kernel visits a row's own pages only; the mask function then keeps
the slots the row owns up to its length (``owner`` and ``logical`` from the cache). The mask's
tensors are fixed buffers updated in place, so the call can be captured in a CUDA graph. Compiled
on CUDA (the fused decode kernel); eager it is the unfused reference torch documents, which is what
the CPU tests run.

``GatherDecode`` copies each row's pages out and runs masked SDPA: simple and exact, but its work
grows with the longest row of the batch. It serves CPUs and checks the other.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn.attention.flex_attention import BlockMask, FlexKernelOptions, flex_attention

from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import PagedKVCache

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
    ) -> torch.Tensor:
        """``[batch, heads, head_dim]`` queries against one layer's cache -> the same shape."""
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
    ) -> torch.Tensor:
        assert isinstance(meta, _Gathered)
        slots, keep, batch, width = meta.slots, meta.keep, meta.batch, meta.width
        shape = (-1, batch, width, query.shape[-1])
        picked_keys = keys.index_select(1, slots).view(shape).transpose(0, 1)
        picked_values = values.index_select(1, slots).view(shape).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, None, :],
            picked_keys,
            picked_values,
            attn_mask=keep,
            scale=scale,
            enable_gqa=True,
        )
        return out[:, :, 0, :]
