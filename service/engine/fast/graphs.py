"""The decode step captured as CUDA graphs, one per batch-size bucket and sampling mode.

A step at a batch size between buckets runs the next bucket up; the rows past the batch hold no
request (their keys go to the cache's scratch page and their tokens are never read). Graphs are
captured largest first into one memory pool, before the engine reports ready, after two warm-up
runs of each shape (which also compile it when compilation is on).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Batch sizes with a graph: dense where a step is cheap, at most a third of padding above 64.
_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def buckets_up_to(rows: int) -> tuple[int, ...]:
    """The buckets for at most ``rows`` rows, ``rows`` itself the last one."""
    kept = tuple(b for b in _BUCKETS if b < rows)
    return (*kept, rows)


class DecodeGraphs:
    def __init__(
        self,
        step: Callable[[int, bool], None],
        buckets: tuple[int, ...],
        device: torch.device,
    ) -> None:
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        with torch.inference_mode():
            for bucket in sorted(buckets, reverse=True):
                for full in (False, True):
                    side.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(side):
                        step(bucket, full)
                        step(bucket, full)
                    torch.cuda.current_stream(device).wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        step(bucket, full)
                    self._graphs[(bucket, full)] = graph
        torch.cuda.synchronize(device)

    @property
    def count(self) -> int:
        return len(self._graphs)

    def replay(self, bucket: int, full: bool) -> None:
        self._graphs[(bucket, full)].replay()
