"""Up to which batch size the engine's own decode attention serves, measured on the device at
start.

The Triton kernel (``attention.TritonDecode``) beats FlexAttention's decoding kernel where its one
launch per layer saves most (small batches); whether it still does at a wide batch depends on the
GPU (its SMs, its memory's bandwidth) and cannot be told from here. So, unless the operator set
the bound (``fast_triton_attention_rows``), the engine times both kernels on its own cache before
capturing its graphs: each at one batch-size bucket, every row ``context`` tokens long in pages of
its own, inside a CUDA graph (``kernel_timing.graph_us``), and takes the largest bucket at which
the Triton kernel is at least as fast, searching the buckets in halves from the widest (one
measurement where the kernel wins everywhere). The rows and page owners it wrote are cleared
after.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import torch

from service.engine.fast.attention import FlexDecode, TritonDecode
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import PagedKVCache
from service.engine.fast.kernel_timing import graph_us
from service.engine.fast.pages import pages_for
from service.engine.fast.weights import Geometry

log = logging.getLogger(__name__)

# Calls of a kernel captured in the timing graph.
_REPEAT = 20
# Batches up to this many rows take the Triton kernel without a measurement: it won at every
# such size on every GPU it was timed on (docs/benchmarks.md).
MEASURED_ABOVE = 16


def largest_passing(candidates: Sequence[int], passes: Callable[[int], bool]) -> int | None:
    """The largest of the ascending ``candidates`` that ``passes``, taking it to hold up to some
    point and not beyond: the widest is tried first, then the search halves. None where even the
    first fails."""
    if not candidates:
        return None
    if passes(candidates[-1]):
        return candidates[-1]
    low, high = -1, len(candidates) - 1  # candidates[high] fails; candidates[low] passes
    while high - low > 1:
        middle = (low + high) // 2
        if passes(candidates[middle]):
            low = middle
        else:
            high = middle
    return None if low < 0 else candidates[low]


class AttentionTimer:
    """Times the Triton kernel and FlexAttention (``compiled`` as the engine runs it) at a batch
    of rows of ``context`` tokens on ``cache`` and ``rows`` (both idle: nothing serves yet)."""

    def __init__(
        self,
        cache: PagedKVCache,
        rows: DeviceRows,
        geometry: Geometry,
        triton: TritonDecode,
        context: int,
        compiled: bool = True,
    ) -> None:
        self._cache = cache
        self._rows = rows
        self._geometry = geometry
        self._triton = triton
        self._context = context
        self._compiled = compiled
        self.timings: dict[int, tuple[float, float]] = {}

    def fits(self, batch: int) -> bool:
        """Whether the cache has pages for ``batch`` rows of the context (page 0 is scratch)."""
        return batch * pages_for(self._context, self._cache.page_size) < self._cache.shape.pages

    def triton_wins(self, batch: int) -> bool:
        """Whether the Triton kernel takes at most FlexAttention's time at ``batch`` rows."""
        triton_us, flex_us = self.time(batch)
        return triton_us <= flex_us

    def time(self, batch: int) -> tuple[float, float]:
        """Microseconds per call of the Triton kernel and of FlexAttention at ``batch`` rows."""
        g, cache, rows = self._geometry, self._cache, self._rows
        per_row = pages_for(self._context, cache.page_size)
        pages = list(range(1, 1 + batch * per_row))
        owners = [row for row in range(batch) for _ in range(per_row)]
        places = [place for _ in range(batch) for place in range(per_row)]
        rows.set_pages(owners, places, pages)
        cache.assign(pages, owners, places)
        rows.lengths[:batch] = self._context
        try:
            dtype, device = cache.keys[0].dtype, rows.device
            query = torch.randn(batch, g.heads, g.head_dim, dtype=dtype, device=device)
            keys, values = cache.keys[0], cache.values[0]
            # A FlexAttention of its own, compiled (as the engine's is) for this one size.
            flex = FlexDecode(cache, rows, self._compiled)
            flex_meta = flex.prepare(batch, per_row)
            triton_meta = self._triton.prepare(batch, per_row)
            scale = g.head_dim**-0.5
            triton = partial(self._triton, query, keys, values, triton_meta, scale)
            triton_us = graph_us(triton, _REPEAT, device)
            flexed = partial(flex, query, keys, values, flex_meta, scale)
            flex_us = graph_us(flexed, _REPEAT, device)
        finally:
            rows.block_table[:batch].zero_()
            rows.lengths[:batch] = 0
            cache.clear_owner(pages)
        self.timings[batch] = (triton_us, flex_us)
        return triton_us, flex_us


def measured_triton_rows(timer: AttentionTimer, buckets: Sequence[int]) -> int:
    """The largest bucket at which the Triton kernel is at least as fast as FlexAttention, among
    the buckets above ``MEASURED_ABOVE`` that the cache can hold; ``MEASURED_ABOVE`` (capped at
    the widest bucket) where it loses at the first of them."""
    floor = min(MEASURED_ABOVE, buckets[-1])
    candidates = [b for b in buckets if b > floor and timer.fits(b)]
    chosen = largest_passing(candidates, timer.triton_wins)
    rows = floor if chosen is None else chosen
    log.info(
        "decode attention measured",
        extra={
            "triton_rows": rows,
            "us_triton_flex": {b: list(t) for b, t in sorted(timer.timings.items())},
        },
    )
    return rows
