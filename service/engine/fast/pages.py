"""The KV cache's page accounting: which pages are free, and how many are promised.

Plain Python: the cache's tensors live in ``cache.py``; this owns only the numbers. A request's
pages are committed when it is admitted (its prompt and its whole token budget, so a running
request never waits for memory) but taken one at a time as its positions need them, and given
back, with the commitment, when it finishes. Page 0 is never given out: the rows of a decode
batch that hold no request write their keys there. Pages ``reserve``d at start (the kept prompt
prefixes') are never a request's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold ``tokens`` tokens."""
    return -(-tokens // page_size)


def slots_of(pages: Sequence[int], positions: np.ndarray, page_size: int) -> np.ndarray:
    """Cache slots of ``positions`` in a sequence holding ``pages``."""
    table = np.asarray(pages, dtype=np.int64)
    slots: np.ndarray = table[positions // page_size] * page_size + positions % page_size
    return slots


class PageManager:
    """Free pages and committed pages of a cache of ``pages`` pages (page 0 kept back)."""

    def __init__(self, pages: int) -> None:
        if pages < 2:
            raise ValueError("the KV cache needs at least two pages")
        self._usable = pages - 1
        # Taken from the end: the lowest page numbers go first.
        self._free = list(range(pages - 1, 0, -1))
        self._committed = 0

    @property
    def usable(self) -> int:
        """Pages a request may have: all but the scratch page."""
        return self._usable

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def free(self) -> int:
        """Pages not taken (committed ones included: taken only as positions need them)."""
        return len(self._free)

    def reserve(self, count: int) -> list[int]:
        """``count`` pages taken out for good (no request's, nothing to commit), before any
        request is admitted."""
        if count >= self._usable or self._committed:
            raise ValueError("pages are reserved at start, leaving at least one for requests")
        self._usable -= count
        return [self._free.pop() for _ in range(count)]

    def can_commit(self, pages: int) -> bool:
        return self._committed + pages <= self.usable

    def commit(self, pages: int) -> None:
        if not self.can_commit(pages):
            raise RuntimeError("KV cache pages over-committed")
        self._committed += pages

    def take(self) -> int:
        """One free page, within what was committed."""
        return self._free.pop()

    def release(self, pages: list[int], committed: int) -> None:
        """Give back ``pages`` and a commitment of ``committed`` pages."""
        self._free.extend(pages)
        self._committed -= committed
