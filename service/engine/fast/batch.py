"""The decode batch's state on the device: one row per running request, rows ``0..n-1`` in use
(``host_rows.HostRows`` is its mirror on the host).

A decode step reads and writes only these buffers (the token each row feeds in, its position,
its page table, its sampling parameters and the tokens it has seen), so the step can be a
captured CUDA graph and the host does nothing per row per step. The host touches a row when a
request joins (``activate``), when it needs a new page, and when rows finish: the rows left are
packed down into the holes (``compact``), a handful of batched copies whatever the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from service.engine.fast.sampler import RowSampling
from service.engine.fast.transfer import to_device


@dataclass(frozen=True, slots=True)
class Joining:
    """A request entering the decode batch at ``row`` after its prefill."""

    row: int
    token: int
    position: int
    pages: list[int]
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    penalty: float
    seen: list[int]


class DeviceRows:
    def __init__(self, rows: int, max_pages: int, vocab: int, device: torch.device) -> None:
        self.rows = rows
        self.max_pages = max_pages
        self.device = device

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.tokens = zeros(rows, dtype=torch.long)
        self.positions = zeros(rows, dtype=torch.long)
        self.live = zeros(rows, dtype=torch.long)
        self.lengths = zeros(rows, dtype=torch.int32)
        self.block_table = zeros(rows, max_pages, dtype=torch.int32)
        self.sampled = zeros(rows, dtype=torch.long)
        self.sampling = RowSampling(
            greedy=torch.ones(rows, dtype=torch.bool, device=device),
            temperature=torch.ones(rows, dtype=torch.float32, device=device),
            top_k=torch.ones(rows, dtype=torch.long, device=device),
            top_p=torch.ones(rows, dtype=torch.float32, device=device),
            penalty=torch.ones(rows, dtype=torch.float32, device=device),
            seen=zeros(rows, vocab, dtype=torch.bool),
        )

    def _per_row(self) -> list[torch.Tensor]:
        s = self.sampling
        return [
            self.tokens,
            self.positions,
            self.live,
            self.block_table,
            s.greedy,
            s.temperature,
            s.top_k,
            s.top_p,
            s.penalty,
            s.seen,
        ]

    def rows_of(self, batch: int) -> RowSampling:
        s = self.sampling
        return RowSampling(
            greedy=s.greedy[:batch],
            temperature=s.temperature[:batch],
            top_k=s.top_k[:batch],
            top_p=s.top_p[:batch],
            penalty=s.penalty[:batch],
            seen=s.seen[:batch],
        )

    def activate(self, joining: list[Joining]) -> None:
        """Write the joining requests' rows (a few batched copies for all of them)."""
        if not joining:
            return
        rows = self._index([j.row for j in joining])

        def put(target: torch.Tensor, values: list[float] | list[int] | list[bool]) -> None:
            target.index_copy_(0, rows, to_device(values, target.dtype, self.device))

        put(self.tokens, [j.token for j in joining])
        put(self.positions, [j.position for j in joining])
        put(self.live, [1] * len(joining))
        table = np.zeros((len(joining), self.max_pages), dtype=np.int32)
        for i, j in enumerate(joining):
            table[i, : len(j.pages)] = j.pages
        self.block_table.index_copy_(0, rows, to_device(table, torch.int32, self.device))
        s = self.sampling
        put(s.greedy, [j.greedy for j in joining])
        put(s.temperature, [j.temperature for j in joining])
        put(s.top_k, [j.top_k for j in joining])
        put(s.top_p, [j.top_p for j in joining])
        put(s.penalty, [j.penalty for j in joining])
        s.seen.index_fill_(0, rows, False)
        seen_rows = [j.row for j in joining for _ in j.seen]
        seen_ids = [token for j in joining for token in j.seen]
        s.seen.index_put_(
            (self._index(seen_rows), self._index(seen_ids)),
            torch.ones((), dtype=torch.bool, device=self.device),
        )

    def set_pages(self, rows: list[int], columns: list[int], pages: list[int]) -> None:
        """``block_table[rows[i], columns[i]] = pages[i]``: pages taken as sequences grow."""
        values = to_device(pages, torch.int32, self.device)
        self.block_table.index_put_((self._index(rows), self._index(columns)), values)

    def compact(self, holes: list[int], movers: list[int], end: int, old_end: int) -> None:
        """Move rows ``movers`` into ``holes`` and clear rows ``end..old_end-1``."""
        if holes:
            dst, src = self._index(holes), self._index(movers)
            for tensor in self._per_row():
                tensor.index_copy_(0, dst, tensor.index_select(0, src))
        if old_end > end:
            for tensor in (self.live, self.positions, self.tokens, self.block_table):
                tensor[end:old_end] = 0

    def _index(self, values: list[int]) -> torch.Tensor:
        return to_device(values, torch.long, self.device)
