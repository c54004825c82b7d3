"""One prefill step's inputs: pieces of prompts packed for the varlen kernel.

A piece is a run of one prompt's tokens (the whole prompt, or a chunk of a long one) whose pages
are already taken. Packing lays the pieces end to end, with each token's cache slot read off its
sequence's page table and the cumulative lengths the varlen kernel takes; a piece that does not
start at the prompt's beginning also attends to the keys already cached before it, so then the
slots of every sequence's keys are packed too. A piece that reuses kept prefix blocks
(``prefix_cache.Reuse``) brings the cache-slot copies that put them in place and keep its own
blocks; each layer makes them after writing the step's keys, before its attention reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from service.engine.fast.pages import slots_of
from service.engine.fast.prefix_cache import Reuse
from service.engine.fast.transfer import to_device


@dataclass(frozen=True, slots=True)
class Piece:
    prompt: Sequence[int]
    pages: Sequence[int]  # the sequence's pages, covering at least start + count tokens
    start: int
    count: int
    reuse: Reuse | None = None

    @property
    def end(self) -> int:
        return self.start + self.count

    @property
    def completes(self) -> bool:
        return self.end == len(self.prompt)


@dataclass(frozen=True, slots=True)
class PackedPrefill:
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor  # where each token's keys and values are written
    cu_q: torch.Tensor  # int32 cumulative query lengths
    cu_k: torch.Tensor  # int32 cumulative key lengths (prefix included)
    max_q: int
    max_k: int
    key_slots: torch.Tensor | None  # every sequence's key slots; None: no piece has a prefix
    last: torch.Tensor  # token indices whose logits are wanted: the last of each completed prompt
    # Cache-slot copies, ``copy_to[i]`` from ``copy_from[i]``: kept prefixes into the prompts
    # that reuse them, and blocks just written out to the kept pages; None: none this step.
    copy_from: torch.Tensor | None
    copy_to: torch.Tensor | None
    # ``cu_q`` and ``cu_k`` as the host has them, for attention that splits the sequences on the
    # host (reading the device's copy back would wait for the device).
    host_starts: tuple[tuple[int, ...], tuple[int, ...]]


def pack(pieces: Sequence[Piece], page_size: int, device: torch.device) -> PackedPrefill:
    tokens: list[int] = []
    positions, slots, key_slots = [], [], []
    cu_q, cu_k, last = [0], [0], []
    copy_from: list[np.ndarray] = []
    copy_to: list[np.ndarray] = []
    for piece in pieces:
        span = np.arange(piece.start, piece.end)
        tokens.extend(piece.prompt[piece.start : piece.end])
        positions.append(span)
        slots.append(slots_of(piece.pages, span, page_size))
        key_slots.append(slots_of(piece.pages, np.arange(piece.end), page_size))
        cu_q.append(cu_q[-1] + piece.count)
        cu_k.append(cu_k[-1] + piece.end)
        if piece.completes:
            last.append(cu_q[-1] - 1)
        if piece.reuse is not None:
            reuse = piece.reuse
            copy_from += [reuse.into, slots_of(piece.pages, reuse.out_positions, page_size)]
            copy_to += [slots_of(piece.pages, np.arange(reuse.tokens), page_size), reuse.out_slots]

    copies = sum(len(part) for part in copy_from) > 0

    def on_device(values: list[int] | np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return to_device(values, dtype, device)

    return PackedPrefill(
        tokens=on_device(tokens),
        positions=on_device(np.concatenate(positions)),
        slots=on_device(np.concatenate(slots)),
        cu_q=on_device(cu_q, torch.int32),
        cu_k=on_device(cu_k, torch.int32),
        max_q=max(piece.count for piece in pieces),
        max_k=max(piece.end for piece in pieces),
        key_slots=(
            on_device(np.concatenate(key_slots))
            if any(piece.start > 0 for piece in pieces)
            else None
        ),
        last=on_device(last),
        copy_from=on_device(np.concatenate(copy_from)) if copies else None,
        copy_to=on_device(np.concatenate(copy_to)) if copies else None,
        host_starts=(tuple(cu_q), tuple(cu_k)),
    )
