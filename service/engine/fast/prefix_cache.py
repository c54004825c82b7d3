"""Prompt prefixes whose keys and values are already computed: the family's template before the
text, a repeated glossary or context, a text sent again.

Plain Python and numpy: this owns which prefixes are kept and where; the device copies the
slots it names. Prompts are cut into blocks of ``PREFIX_BLOCK`` tokens; a block is named by a
digest of every token up to its end (a chain, as vLLM's block hashes), so a block matches only
where the whole prefix before it matches too. Blocks live in pages of their own, taken out of the
cache at start and never a request's. A prompt that starts with kept blocks has their keys and
values copied into its own first slots (one copy per layer, in its prefill) and is prefilled from
there on; its own pages stay its own, so decode and the page accounting are unchanged. Keys are
rotated by position before they are cached, and a kept block always sits at the same positions.

A block is kept the second time it is seen, from the prefill (or the chunk of a long prompt's
prefill) that computes it: its keys are copied out after that layer's write. A text sent once
costs nothing. Kept blocks are evicted least recently used first; a prompt's blocks are touched
last to first, so that a prefix's first block, which every longer match needs, leaves last. A
block touched in the current step is never evicted in it, and one kept in it is not read in it:
a step's copies into and out of the kept pages must not overlap.
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

from service.engine.fast.pages import PageManager

# Tokens per block: the granularity of a match. Smaller blocks match more of a template that
# does not end at a block's edge, for a digest per block on the host.
PREFIX_BLOCK = 8
# Kept tokens when the operator does not say, and the most of the cache they take by default.
DEFAULT_TOKENS = 4096
DEFAULT_SHARE = 16
# Digests of blocks seen once, per kept block: a block is kept when seen again within this.
SEEN_PER_KEPT = 8


@dataclass(frozen=True, slots=True)
class Reuse:
    """What a prompt takes from the kept blocks and gives them: its first ``tokens`` tokens'
    keys and values copied in from the kept slots ``into`` (in order), and its positions
    ``out_positions`` copied out to the kept slots ``out_slots`` after this step writes them."""

    tokens: int
    into: np.ndarray
    out_positions: np.ndarray
    out_slots: np.ndarray


_NONE = np.zeros(0, dtype=np.int64)


def digests(prompt: tuple[int, ...] | list[int], blocks: int) -> list[bytes]:
    """The chained digests of the prompt's first ``blocks`` blocks."""
    data = np.asarray(prompt[: blocks * PREFIX_BLOCK], dtype=np.int64).tobytes()
    width = PREFIX_BLOCK * 8
    chain, previous = [], b""
    for index in range(blocks):
        previous = hashlib.blake2b(
            previous + data[index * width : (index + 1) * width], digest_size=16
        ).digest()
        chain.append(previous)
    return chain


class PrefixCache:
    """Kept prompt blocks in ``pages`` (taken from the cache for good) of ``page_size`` slots."""

    def __init__(self, pages: list[int], page_size: int) -> None:
        if page_size % PREFIX_BLOCK:
            raise ValueError(f"the page size must be a multiple of {PREFIX_BLOCK}")
        per_page = page_size // PREFIX_BLOCK
        # Each block's first slot: a block is PREFIX_BLOCK slots in a row, inside one page.
        self._free = [p * page_size + b * PREFIX_BLOCK for p in pages for b in range(per_page)]
        self.capacity = len(self._free)
        self._kept: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._touched: dict[bytes, int] = {}  # digest -> the step it was last used in
        self._seen: LRUCache[bytes, None] = LRUCache(maxsize=max(1, SEEN_PER_KEPT * self.capacity))
        self._step = 0
        self._fresh: set[bytes] = set()  # blocks kept in this step, written by it
        self.reused_tokens = 0  # prompt tokens copied in instead of prefilled, since start

    @classmethod
    def reserve(cls, pages: PageManager, page_size: int, tokens: int | None) -> PrefixCache | None:
        """A cache of about ``tokens`` tokens in pages taken out of ``pages`` (unset: the
        default, at most a ``DEFAULT_SHARE``-th of them); None for none."""
        if tokens is None:
            count = min(DEFAULT_TOKENS // page_size, pages.usable // DEFAULT_SHARE)
        else:
            count = min(-(-tokens // page_size), pages.usable - 1)
        if count <= 0:
            return None
        return cls(pages.reserve(count), page_size)

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def free(self) -> int:
        """Blocks holding no kept prefix."""
        return len(self._free)

    def next_step(self) -> None:
        """A new prefill step: blocks touched before it may be evicted again."""
        self._step += 1
        self._fresh.clear()

    def clear(self) -> None:
        """Forget every kept block (a failed step may have kept blocks it never wrote)."""
        self._free.extend(self._kept.values())
        self._kept.clear()
        self._touched.clear()
        self._fresh.clear()
        self._seen.clear()

    def admit(self, prompt: tuple[int, ...], budget: int) -> Reuse:
        """What the prompt reuses and keeps when it is admitted into a prefill step with
        ``budget`` tokens left: the longest kept prefix (leaving at least its last token to
        prefill), and those of its blocks this step writes that were seen before."""
        chain = digests(prompt, len(prompt) // PREFIX_BLOCK)
        matched = 0
        usable = (len(prompt) - 1) // PREFIX_BLOCK
        # A block kept in this step is written by it: it is not read in it too.
        while (
            matched < usable and chain[matched] in self._kept and chain[matched] not in self._fresh
        ):
            matched += 1
        for digest in reversed(chain[:matched]):
            self._touch(digest)
        tokens = matched * PREFIX_BLOCK
        written = (tokens + min(budget, len(prompt) - tokens)) // PREFIX_BLOCK
        into = [self._kept[digest] for digest in chain[:matched]]
        self.reused_tokens += tokens
        return self._offer(chain, matched, written, tokens, into)

    def keep(self, prompt: tuple[int, ...], start: int, end: int) -> Reuse:
        """What a later chunk of a prompt, positions ``start`` to ``end``, keeps: the blocks it
        completes that were seen before."""
        chain = digests(prompt, end // PREFIX_BLOCK)
        return self._offer(chain, start // PREFIX_BLOCK, end // PREFIX_BLOCK, 0, [])

    def _offer(
        self, chain: list[bytes], first: int, last: int, tokens: int, into: list[int]
    ) -> Reuse:
        """The blocks ``first`` to ``last - 1`` of ``chain`` kept where they were seen before
        (copied out after this step writes them), with what the prompt reuses."""
        out_blocks, out_starts = [], []
        for index in range(first, last):
            digest = chain[index]
            if digest in self._kept:
                continue  # kept already (by another prompt of this step)
            if digest not in self._seen:
                self._seen[digest] = None
                continue
            start = self._place(digest)
            if start is None:
                break
            out_blocks.append(index * PREFIX_BLOCK)
            out_starts.append(start)
        return Reuse(tokens, _spans(into), _spans(out_blocks), _spans(out_starts))

    def _touch(self, digest: bytes) -> None:
        self._kept.move_to_end(digest)
        self._touched[digest] = self._step

    def _place(self, digest: bytes) -> int | None:
        """A free block for ``digest`` (evicting the least recently used one not touched this
        step), kept from now on; None when every block is in use this step."""
        if not self._free:
            oldest = next(iter(self._kept))
            if self._touched.get(oldest) == self._step:
                return None
            self._free.append(self._kept.pop(oldest))
            del self._touched[oldest]
        start = self._free.pop()
        self._kept[digest] = start
        self._touched[digest] = self._step
        self._fresh.add(digest)
        return start


def _spans(starts: list[int]) -> np.ndarray:
    """Every slot (or position) of the blocks starting at ``starts``, in order."""
    if not starts:
        return _NONE
    first = np.asarray(starts, dtype=np.int64)
    spans: np.ndarray = (first[:, None] + np.arange(PREFIX_BLOCK)).reshape(-1)
    return spans
