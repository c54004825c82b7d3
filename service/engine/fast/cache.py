"""The paged KV cache's tensors: fixed-size pages of keys and values for every layer, the tables
that say which decode row owns each page, and how many pages fit on the device.

One tensor per layer and kind, ``[kv_heads, pages * page_size, head_dim]``: a token's slot is
``page * page_size + offset``, the layout FlexAttention reads as one long key sequence. Page 0 is
never given out: rows of a decode batch that hold no request write there. Which pages are free or
committed is ``pages.PageManager``'s; a page's owner row and its place in the owner's sequence are
written here when the scheduler says so (the decode mask reads both).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from service.engine.fast.pages import pages_for
from service.engine.fast.sampler import full_sort_rows
from service.engine.fast.transfer import to_device
from service.engine.fast.weights import Geometry

log = logging.getLogger(__name__)


# The KV cache's 8-bit storage (``fast_kv_cache_dtype=fp8``): e4m3, scale 1 (the keys come out
# of RMS norms and the values of a normed input's product: far inside its range), values past
# its largest finite number clamped to it, as vLLM's uncalibrated FP8 cache stores them.
KV_FP8 = torch.float8_e4m3fn
_FP8_LARGEST = torch.finfo(KV_FP8).max


def stored(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache stores it in ``dtype``."""
    if x.dtype == dtype:
        return x
    if dtype == KV_FP8:
        x = x.clamp(-_FP8_LARGEST, _FP8_LARGEST)
    return x.to(dtype)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """8-bit keys or values as their bytes, for the slot copies torch has no FP8 kernel for (a
    CPU's ``index_copy``); 16- or 32-bit ones as they are."""
    return x.view(torch.uint8) if x.dtype == KV_FP8 else x


def read_slots(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One layer's cached keys or values at ``slots`` (``[kv_heads, len(slots), head_dim]``),
    in ``dtype``."""
    picked = _bytes(cache).index_select(1, slots)
    return picked.view(cache.dtype).to(dtype)


def page_bytes(geometry: Geometry, layers: int, page_size: int, dtype: torch.dtype) -> int:
    """Bytes of one page over all layers, keys and values."""
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * layers * page_size * geometry.kv_heads * geometry.head_dim * element


# Bytes per logit of one decode step's sampling at its widest, for every row: the logits in the
# model's dtype and in float32, their penalized, padded (the two-stage argmax) and scaled copies,
# and as much again: the widest bucket's sampling step warms up in the caching allocator while
# the graph pool already holds the buffers of the bucket's other step, which the warm-up cannot
# reuse.
SAMPLING_BYTES_PER_LOGIT = 40
# Bytes per logit of the full sort (a request with no top-k), for the rows it sorts at once
# (``sampler.full_sort_rows``): the penalized and scaled copies, the sorted values and their
# int64 order, the masked probabilities, their cumulative sum, the race's noise and draws (48
# bytes), and as much again for the same reason.
FULL_SORT_BYTES_PER_LOGIT = 96
# Bytes per prefill token and hidden unit: the residual stream, the normed input, the fused
# projections' outputs and the MLP's activations in the model's dtype, with headroom.
PREFILL_BYTES_PER_HIDDEN = 32


def workspace_bytes(
    geometry: Geometry,
    rows: int,
    prefill_tokens: int,
    graph_tokens: int = 0,
    dequantized: int = 0,
    dequantized_above: int | None = None,
) -> int:
    """What a step needs beside the weights and the cache: the sampling buffers of the widest
    decode batch, the activations of the largest prefill chunk and of the largest captured
    prefill step (``graph_tokens``), and the largest weight a product dequantizes at once
    (``dequantized`` bytes, bitsandbytes weights on a GPU), for each of the three that has
    more rows than ``dequantized_above`` (unset: all three). Reserved before the cache
    takes its share, so that a device with little free memory (a second copy of the weights, a
    neighbour on the GPU) still captures its largest graph instead of running out of memory."""
    sampling = rows * geometry.vocab * SAMPLING_BYTES_PER_LOGIT
    sorted_rows = min(rows, full_sort_rows(rows))
    sampling += sorted_rows * geometry.vocab * FULL_SORT_BYTES_PER_LOGIT
    width = max(geometry.hidden, geometry.intermediate)
    prefill = prefill_tokens * width * PREFILL_BYTES_PER_HIDDEN
    # The captured prefill steps' pool (``prefill_graphs.py``) holds the activations of the
    # largest of them for good, beside the eager prefill's.
    graphs = graph_tokens * width * PREFILL_BYTES_PER_HIDDEN
    # The decode graphs' pool, the prefill graphs' and the eager prefill's each keep one, where
    # their widest step dequantizes (past ``dequantized_above`` rows its kernel reads codes).
    widest = (rows, prefill_tokens, graph_tokens)
    pools = sum(1 for n in widest if dequantized_above is None or n > dequantized_above)
    return sampling + prefill + graphs + pools * dequantized


# The KV cache's page count is rounded down to a multiple of this (``budget_pages``).
PAGE_QUANTUM = 64


def free_bytes(device: torch.device) -> int:
    """Memory still free on ``device``: the GPU's, or on a CPU what the kernel reports
    available (free and reclaimable) to a new allocation."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def allocator_gib(device: torch.device) -> dict[str, float]:
    """What the allocator holds on ``device`` (a GPU's; nothing on a CPU), for the start's log
    lines: after each phase, what the budget's workspace estimate is checked against. Reserved
    is what the budget counts; allocated, what tensors take of it (the rest: free blocks of its
    segments, which later tensors fill where they are small enough)."""
    if device.type != "cuda":
        return {}
    return {
        "reserved_gib": round(torch.cuda.memory_reserved(device) / 2**30, 3),
        "allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 3),
    }


def budget_pages(
    geometry: Geometry,
    layers: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    memory_fraction: float,
    reserved: int = 0,
    most: int | None = None,
    left: int | None = None,
) -> int:
    """Pages that fit in ``memory_fraction`` of the device's free memory (or of what is
    ``left`` of the operator's budget, where that is less) less ``reserved`` bytes
    (``workspace_bytes``), and no more than ``most``."""
    free = free_bytes(device) if left is None else min(free_bytes(device), left)
    usable = max(0, free - reserved) * memory_fraction
    pages = int(usable) // page_bytes(geometry, layers, page_size, dtype)
    if most is not None:
        pages = min(pages, most)
    # The compiled decode kernels are specialised to the cache's size, and the free memory
    # differs by some megabytes from one start to the next (another process's context, the
    # allocator's leftovers): whole multiples of PAGE_QUANTUM let a restart find them in the
    # compile cache instead of compiling every bucket again. Under the operator's budget the
    # size is the same from one start to the next already, and on a small card a quantum's
    # gigabyte is a good share of the cache.
    if pages >= PAGE_QUANTUM and (left is None or left >= free_bytes(device)):
        pages -= pages % PAGE_QUANTUM
    return max(2, pages)


# Cache tokens a decode row must have for the rows to fill: a short translation's prompt and
# output (the load generator's mix averages about 190). Counted in tokens, not pages, so that
# smaller pages do not buy rows whose workspace the cache then pays for.
ROW_TOKENS = 128
# The fewest decode rows the engine shrinks to before it gives up on a device.
MIN_FITTED_ROWS = 16
# The smallest prefill chunk the engine shrinks to, before it takes rows away: a step's prompt
# tokens cost activations only while they run, rows hold their share of the cache all along.
MIN_FITTED_PREFILL = 2048


@dataclass(frozen=True, slots=True)
class Fitted:
    """Decode rows, KV-cache pages and the prefill chunk that fit the device together."""

    rows: int
    pages: int
    prefill_tokens: int
    # Bytes set aside for the widest steps beside the weights and the cache
    # (``workspace_bytes``, before the memory fraction); 0 where the pages were set.
    workspace: int = 0


def fit_rows_and_pages(
    geometry: Geometry,
    layers: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    memory_fraction: float,
    rows: int,
    prefill_tokens: int,
    rows_given: bool,
    left: int | None = None,
    prefill_given: bool = False,
    graph_tokens: int = 0,
    dequantized: int = 0,
    dequantized_above: int | None = None,
) -> Fitted:
    """Decode rows, KV-cache pages and the prefill chunk for this device: ``budget_pages`` with
    the workspace of ``rows`` rows and a ``prefill_tokens`` chunk reserved. Where that leaves
    fewer than ``ROW_TOKENS`` cache tokens a row (a batch that could never fill: a 16 or 24 GB
    card, or weights that nearly fill the GPU, as Hy-MT2-30B-A3B's 60 GB do an 80 GB one), the
    prefill chunk is halved down to ``MIN_FITTED_PREFILL``, then the rows, unless the operator
    set them (``rows_given``, ``prefill_given``: their own figures are kept, and the error says
    what to change)."""
    fitted, chunk = rows, prefill_tokens
    while True:
        graphs = min(graph_tokens, chunk)
        reserved = workspace_bytes(geometry, fitted, chunk, graphs, dequantized, dequantized_above)
        # Never more than every row could fill at the model's longest sequence (on a CPU
        # the free memory is the host's, far more than a small model's rows ever need).
        most = fitted * pages_for(geometry.max_positions, page_size) + 1
        pages = budget_pages(
            geometry, layers, page_size, dtype, device, memory_fraction, reserved, most, left
        )
        if pages * page_size >= fitted * ROW_TOKENS:
            if (fitted, chunk) != (rows, prefill_tokens):
                log.warning(
                    "decode rows or prefill chunk lowered to fit the KV cache",
                    extra={
                        "rows": fitted,
                        "wanted": rows,
                        "prefill_tokens": chunk,
                        "wanted_prefill_tokens": prefill_tokens,
                        "pages": pages,
                    },
                )
            return Fitted(fitted, pages, chunk, reserved)
        if not prefill_given and chunk // 2 >= MIN_FITTED_PREFILL:
            chunk //= 2
            continue
        if rows_given or fitted // 2 < MIN_FITTED_ROWS:
            free = free_bytes(device) if left is None else min(free_bytes(device), left)
            raise RuntimeError(
                f"the fast engine's KV cache would hold only {pages} pages for {fitted} decode "
                f"rows: {free / 2**30:.2f} GiB are left after loading and "
                f"{reserved / 2**30:.2f} GiB are set aside for the widest step; lower "
                "HYMT_FAST_MAX_ROWS or HYMT_FAST_PREFILL_TOKENS, quantize the weights, raise "
                "HYMT_GPU_MEMORY_GIB, or set HYMT_FAST_NUM_PAGES"
            )
        fitted //= 2


@dataclass(frozen=True, slots=True)
class CacheShape:
    pages: int
    page_size: int

    @property
    def slots(self) -> int:
        return self.pages * self.page_size


class PagedKVCache:
    """The cache tensors and the ownership tables the decode mask reads: keys and values stored
    in ``dtype``, read in the model's ``compute`` dtype (the same, or 8-bit storage)."""

    def __init__(
        self,
        geometry: Geometry,
        layers: int,
        shape: CacheShape,
        dtype: torch.dtype,
        device: torch.device,
        compute: torch.dtype | None = None,
    ) -> None:
        if shape.pages < 2:
            raise ValueError("the KV cache needs at least two pages")
        self.dtype = dtype
        self.compute = dtype if compute is None else compute
        self.shape = shape
        self.page_size = shape.page_size
        dims = (geometry.kv_heads, shape.slots, geometry.head_dim)
        self.keys = [torch.zeros(dims, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(dims, dtype=dtype, device=device) for _ in range(layers)]
        # Decode-batch row owning each page (-1: free) and the page's index in that sequence.
        self.owner = torch.full((shape.pages,), -1, dtype=torch.int32, device=device)
        self.logical = torch.zeros(shape.pages, dtype=torch.int32, device=device)
        self.page_bytes = page_bytes(geometry, layers, shape.page_size, dtype)
        log.info(
            "kv cache allocated",
            extra={
                "pages": shape.pages,
                "page_size": shape.page_size,
                "dtype": str(dtype).removeprefix("torch."),
                "bytes": 2 * layers * self.keys[0].nelement() * self.keys[0].element_size(),
                **allocator_gib(device),
            },
        )

    def assign(self, pages: list[int], rows: list[int], logical: list[int]) -> None:
        """Record on the device that ``pages[i]`` is page ``logical[i]`` of decode row
        ``rows[i]`` (one batched write for all of them)."""
        if not pages:
            return
        device = self.owner.device
        index = to_device(pages, torch.long, device)
        owners = to_device(rows, torch.int32, device)
        places = to_device(logical, torch.int32, device)
        self.owner.index_copy_(0, index, owners)
        self.logical.index_copy_(0, index, places)

    def clear_owner(self, pages: list[int]) -> None:
        if pages:
            index = to_device(pages, torch.long, self.owner.device)
            self.owner.index_fill_(0, index, -1)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``slots`` as ``[tokens, kv_heads, head_dim]``, in the model's
        dtype."""
        keys = read_slots(self.keys[layer], slots, self.compute).transpose(0, 1)
        values = read_slots(self.values[layer], slots, self.compute).transpose(0, 1)
        return keys, values

    def copy(self, layer: int, source: torch.Tensor, target: torch.Tensor) -> None:
        """One layer's keys and values at slots ``source`` copied to slots ``target`` (the two
        sets disjoint)."""
        for cache in (self.keys[layer], self.values[layer]):
            raw = _bytes(cache)
            raw.index_copy_(1, target, raw.index_select(1, source))


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Store ``[tokens, kv_heads, head_dim]`` keys and values of one layer at ``slots``."""
    for cache, new in ((key_cache, keys), (value_cache, values)):
        _bytes(cache).index_copy_(1, slots, _bytes(stored(new, cache.dtype).transpose(0, 1)))
