"""Prefill steps captured as CUDA graphs, one per token bucket (``prefill.Bucket``).

A prefill launches every layer's operations from the host one at a time. Where the decode step
is shorter than that launching (a small card's batch; an FP8 step of 1,024 rows on a fast card,
while the prompts that arrived during the last step are prefilled) the host, not the device,
sets the pace of the whole step loop; a captured step is one launch. A step of up to the
largest bucket's tokens is laid out in the smallest bucket it fits (``HostPrefill.padded``),
copied in with one host-to-device copy and replayed; a step that fits none (more tokens,
sequences, keys, logits' rows or copies, or a prompt piece longer than a bucket's longest)
takes the uncaptured prefill.

The graphs share a memory pool of their own, apart from the decode graphs': a prefill's logits
are read by the first tokens' sampling, launched right after the replay, and no decode replay
may write over them first. Captured largest first, so the smaller ones reuse its memory.

On a CPU nothing is captured: the same buffers run uncaptured, so the tests drive this path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from service.engine.fast.cache import allocator_gib
from service.engine.fast.prefill import Bucket, HostPrefill, PackedPrefill, prefill_buckets
from service.engine.fast.transfer import copy_into

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0, dtype=np.int64)
# A step with no tokens: padded, all of a bucket is the padding's own sequence (warm-up input).
NOTHING = HostPrefill(
    tokens=_EMPTY,
    positions=_EMPTY,
    slots=_EMPTY,
    cu_q=np.zeros(1, dtype=np.int64),
    cu_k=np.zeros(1, dtype=np.int64),
    key_slots=_EMPTY,
    prefixed=False,
    last=_EMPTY,
    copy_from=_EMPTY,
    copy_to=_EMPTY,
)


class PrefillGraphs:
    """``prefill`` (``Transformer.prefill``) in each of ``buckets``' shapes, captured on a GPU."""

    def __init__(
        self,
        prefill: Callable[[PackedPrefill], torch.Tensor],
        buckets: Sequence[Bucket],
        device: torch.device,
    ) -> None:
        self._prefill = prefill
        self._capture = device.type == "cuda"
        self._buckets = sorted(buckets, key=lambda bucket: bucket.tokens)
        self._flat = {b: torch.zeros(b.size, dtype=torch.long, device=device) for b in buckets}
        self._graphs: dict[Bucket, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[Bucket, torch.Tensor] = {}
        self.steps = 0  # prefill steps run in a bucket
        if self._capture:
            self._capture_all(device)

    def _capture_all(self, device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        with torch.inference_mode():
            for bucket in reversed(self._buckets):
                flat = self._flat[bucket]
                flat.copy_(torch.from_numpy(NOTHING.padded(bucket)))
                static = bucket.packed(flat)
                side.wait_stream(current)
                with torch.cuda.stream(side):  # twice: compiled parts settle, then capture
                    self._prefill(static)
                    self._prefill(static)
                current.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._outputs[bucket] = self._prefill(static)
                self._graphs[bucket] = graph
        torch.cuda.synchronize(device)

    @property
    def largest(self) -> int:
        return self._buckets[-1].tokens if self._buckets else 0

    def bucket_for(self, step: HostPrefill) -> Bucket | None:
        """The smallest bucket ``step`` fits, or None."""
        return next((b for b in self._buckets if step.fits(b)), None)

    def run(self, step: HostPrefill, bucket: Bucket) -> torch.Tensor:
        """Float32 logits ``[len(step.last), vocab]``, as ``prefill`` of the step would give."""
        self.steps += 1
        padded = step.padded(bucket)
        flat = self._flat[bucket]
        copy_into(flat, padded)
        if self._capture:
            self._graphs[bucket].replay()
            return self._outputs[bucket][: len(step.last)]
        # Uncaptured (a CPU): the attention there splits the sequences on the host.
        spans = bucket.spans
        starts = (tuple(padded[spans["cu_q"]].tolist()), tuple(padded[spans["cu_k"]].tolist()))
        with torch.inference_mode():
            logits = self._prefill(bucket.packed(flat, starts))
        return logits[: len(step.last)]


def capture(
    prefill: Callable[[PackedPrefill], torch.Tensor],
    tokens: int,
    device: torch.device,
    required: bool,
) -> PrefillGraphs | None:
    """Graphs for prefill steps of up to ``tokens`` tokens, or None where there are none to
    take. A capture that fails leaves the prefill uncaptured (slower, not wrong), with a
    warning, unless the operator asked for the graphs (``required``)."""
    buckets = prefill_buckets(tokens)
    if not buckets:
        return None
    try:
        graphs = PrefillGraphs(prefill, buckets, device)
    except Exception as failure:  # a capture that fails costs speed, never the service
        if required:
            raise
        log.warning("prefill graphs off: the capture failed", extra={"error": str(failure)[:500]})
        return None
    log.info(
        "prefill graphs captured",
        extra={"buckets": len(buckets), "tokens": tokens, **allocator_gib(device)},
    )
    return graphs
