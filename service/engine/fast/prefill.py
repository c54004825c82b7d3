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


@dataclass(frozen=True, slots=True)
class HostPrefill:
    """A prefill step laid out on the host (``layout``): what ``PackedPrefill`` holds, before
    it goes to the device whole (``packed``) or padded into a captured step's buffers
    (``padded``)."""

    tokens: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    cu_q: np.ndarray
    cu_k: np.ndarray
    key_slots: np.ndarray  # every sequence's key slots (read only where ``prefixed``)
    prefixed: bool  # whether a piece starts after keys already cached
    last: np.ndarray
    copy_from: np.ndarray
    copy_to: np.ndarray

    @property
    def max_q(self) -> int:
        return int(np.diff(self.cu_q).max())

    @property
    def max_k(self) -> int:
        return int(np.diff(self.cu_k).max())

    def packed(self, device: torch.device) -> PackedPrefill:
        def on_device(values: np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return to_device(values, dtype, device)

        copies = len(self.copy_from) > 0
        return PackedPrefill(
            tokens=on_device(self.tokens),
            positions=on_device(self.positions),
            slots=on_device(self.slots),
            cu_q=on_device(self.cu_q, torch.int32),
            cu_k=on_device(self.cu_k, torch.int32),
            max_q=self.max_q,
            max_k=self.max_k,
            key_slots=on_device(self.key_slots) if self.prefixed else None,
            last=on_device(self.last),
            copy_from=on_device(self.copy_from) if copies else None,
            copy_to=on_device(self.copy_to) if copies else None,
            host_starts=(tuple(self.cu_q.tolist()), tuple(self.cu_k.tolist())),
        )

    def padded(self, bucket: Bucket) -> np.ndarray:
        """The step in ``bucket``'s fixed shapes, as one int64 array (``Bucket.fields``'s
        order): the tokens past this step's form sequences of their own of at most
        ``bucket.queries`` tokens each, at position 0 with their keys and values in the scratch
        slot 0 (page 0 is never given out), so every row the kernels compute stays finite;
        sequences past them are empty; the logits' rows past this step's read token 0, the
        copies past its own copy slot 0 onto itself. The keys are always read back from the
        cache (``key_slots``), which is exact: a piece without a prefix reads the keys it has
        just written."""
        real, keys = len(self.tokens), len(self.key_slots)
        padding = bucket.tokens - real
        flat = np.zeros(bucket.size, dtype=np.int64)
        views = {name: flat[span] for name, span in bucket.spans.items()}
        views["tokens"][:real] = self.tokens
        views["positions"][:real] = self.positions
        views["slots"][:real] = self.slots
        count = len(self.cu_q)
        views["cu_q"][:count] = self.cu_q
        views["cu_k"][:count] = self.cu_k
        # The padding's sequences, each at most ``queries`` long: the kernel's grid is sized by
        # the longest sequence, for every sequence.
        ends = np.minimum(
            np.arange(1, _pads(padding, bucket.queries) + 1) * bucket.queries, padding
        )
        views["cu_q"][count : count + len(ends)] = real + ends
        views["cu_q"][count + len(ends) :] = bucket.tokens
        views["cu_k"][count : count + len(ends)] = keys + ends
        views["cu_k"][count + len(ends) :] = keys + padding
        views["key_slots"][:keys] = self.key_slots
        views["last"][: len(self.last)] = self.last
        views["copy_from"][: len(self.copy_from)] = self.copy_from
        views["copy_to"][: len(self.copy_to)] = self.copy_to
        return flat

    def fits(self, bucket: Bucket) -> bool:
        """Whether this step goes into ``bucket``'s shapes (its padding sequences included)."""
        padding = bucket.tokens - len(self.tokens)
        return (
            padding >= 0
            and len(self.cu_q) + _pads(padding, bucket.queries) <= bucket.bounds
            and (len(self.tokens) == 0 or self.max_q <= bucket.queries)
            and len(self.key_slots) + padding <= bucket.keys
            and len(self.last) <= bucket.last
            and len(self.copy_from) <= bucket.copies
        )


def _pads(padding: int, queries: int) -> int:
    """The sequences ``padding`` tokens take, at most ``queries`` each."""
    return -(-padding // queries)


@dataclass(frozen=True, slots=True)
class Bucket:
    """The fixed shapes of a captured prefill step: ``tokens`` packed tokens in at most
    ``sequences`` sequences of at most ``queries`` tokens each (and the padding's, as many as
    its tokens need), ``keys`` key slots read back, ``last`` logits' rows and ``copies``
    cache-slot copies."""

    tokens: int
    sequences: int
    keys: int
    last: int
    copies: int
    queries: int

    @property
    def bounds(self) -> int:
        """The sequences' cumulative bounds: the step's sequences, the padding's, and 0."""
        return self.sequences + _pads(self.tokens, self.queries) + 1

    fields = (
        "tokens", "positions", "slots", "cu_q", "cu_k", "key_slots", "last", "copy_from", "copy_to",
    )  # fmt: skip

    @property
    def spans(self) -> dict[str, slice]:
        """Where each of ``fields`` lies in the one array of a step of these shapes."""
        t, cu = self.tokens, self.bounds
        lengths = (t, t, t, cu, cu, self.keys, self.last, self.copies, self.copies)
        ends = np.cumsum(lengths).tolist()
        return {
            name: slice(end - length, end)
            for name, length, end in zip(self.fields, lengths, ends, strict=True)
        }

    @property
    def size(self) -> int:
        stop: int = self.spans[self.fields[-1]].stop
        return stop

    def packed(
        self, flat: torch.Tensor, host_starts: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    ) -> PackedPrefill:
        """A step of these shapes reading its values from ``flat`` (``HostPrefill.padded``'s
        layout, on the device): views, so that a captured step reads whatever is copied in
        (``host_starts``: the sequences' bounds for attention that splits them on the host,
        never a captured step's)."""
        views = {name: flat[span] for name, span in self.spans.items()}
        return PackedPrefill(
            tokens=views["tokens"],
            positions=views["positions"],
            slots=views["slots"],
            cu_q=views["cu_q"],
            cu_k=views["cu_k"],
            max_q=self.queries,
            max_k=self.keys,
            key_slots=views["key_slots"],
            last=views["last"],
            copy_from=views["copy_from"],
            copy_to=views["copy_to"],
            host_starts=host_starts,
        )


# The captured prefill steps' token counts: a step is padded to the next one, so past 64 they
# are 64 apart (a step of 385 tokens computes 63 more, not 127), and 128 past 1,024.
_TOKEN_BUCKETS = (16, 32, *range(64, 1024 + 1, 64), *range(1024 + 128, 2048 + 1, 128))
# The longest sequence a captured step holds: the flash kernel's grid is a block per 128
# queries of the longest sequence for every sequence and head, the empty ones too, each costing
# a block's start. A translation's pieces are shorter; a longer one takes the uncaptured prefill.
_QUERIES = 256


def prefill_buckets(largest: int) -> list[Bucket]:
    """The captured shapes for prefill steps of up to ``largest`` tokens: 16 sequences, up to 32
    from 512 tokens (each costs the flash kernel's blocks, and every prompt a row of the output
    layer, at every replay), of at most ``_QUERIES`` tokens; keys and copies four times the
    tokens."""
    return [
        Bucket(tokens, sequences, 4 * tokens, sequences, 4 * tokens, min(tokens, _QUERIES))
        for tokens in _TOKEN_BUCKETS
        if tokens <= largest
        for sequences in (min(32, max(16, tokens // 16)),)
    ]


def layout(pieces: Sequence[Piece], page_size: int) -> HostPrefill:
    """The pieces laid end to end on the host."""
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

    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    return HostPrefill(
        tokens=np.asarray(tokens, dtype=np.int64),
        positions=joined(positions),
        slots=joined(slots),
        cu_q=np.asarray(cu_q, dtype=np.int64),
        cu_k=np.asarray(cu_k, dtype=np.int64),
        key_slots=joined(key_slots),
        prefixed=any(piece.start > 0 for piece in pieces),
        last=np.asarray(last, dtype=np.int64),
        copy_from=joined(copy_from),
        copy_to=joined(copy_to),
    )


def pack(pieces: Sequence[Piece], page_size: int, device: torch.device) -> PackedPrefill:
    """The pieces laid end to end, on ``device``."""
    return layout(pieces, page_size).packed(device)
