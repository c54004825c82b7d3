"""Timing a piece of device work as a decode step runs it: inside a CUDA graph.

``graph_us`` captures ``repeat`` calls in one graph and replays it, so the figure is device time
per call including the gaps between its kernels, without the host's launch cost, which a
replayed decode step does not pay either. The engine uses it to choose a kernel at start
(``attention_choice.py``); the kernel benchmarks in ``loadtests`` use it too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_REPLAYS = 10


def graph_us(call: Callable[[], object], repeat: int, device: torch.device) -> float:
    """Device microseconds per call of ``call``, ``repeat`` calls captured in one graph (on a
    CPU the call runs once and the figure is 0)."""
    if device.type != "cuda":
        call()
        return 0.0
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # compiled code compiles, Triton kernels load, before the capture
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            call()
    graph.replay()
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(_REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return round(1000 * float(start.elapsed_time(end)) / (_REPLAYS * repeat), 2)
