"""The decode step captured as CUDA graphs, one per batch-size bucket and sampling mode.

A step at a batch size between buckets runs the next bucket up; the rows past the batch hold no
request (their keys go to the cache's scratch page and their tokens are never read). Every shape
first runs twice uncaptured (which also compiles it when compilation is on); the caching
allocator then gives that memory back, and the graphs are captured largest first into one memory
pool, before the engine reports ready. Warming up everything before capturing anything keeps the
peak at the larger of the two phases: a warm-up between captures needs memory of its own beside
the pool's, which the pool cannot lend it.
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
        largest_first = sorted(buckets, reverse=True)
        shapes = [(bucket, full) for bucket in largest_first for full in (False, True)]
        with torch.inference_mode():
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for bucket, full in shapes:
                    step(bucket, full)
                    step(bucket, full)
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            for bucket, full in shapes:
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
