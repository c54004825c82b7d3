"""Which parts of the model are compiled with torch.compile, and why only those.

A decode step at small batch is bound by kernel count, not by arithmetic: on the H200 a lone
request spent 12.49 ms of GPU time per token, of which the weight GEMMs were 4.55 ms and most of
the rest hundreds of tiny elementwise and reduction kernels (loadtests/profile.py). Hunyuan's
RMSNorm alone is eight of them (cast, pow, mean, add, rsqrt, mul, cast, mul), and the model runs
129 norms per token (two per layer, a query and a key norm per layer, the final one). Compiled,
each norm is one fused kernel.

Only the norms are compiled, each module on its own ("regional" compilation): they hold no
cache, no data-dependent shapes and no graph breaks, so every instance shares a handful of
compiled graphs (one per shape class) and compiling the whole model is not needed. The full
model step cannot be compiled as a unit under continuous batching: transformers' paged cache
update is excluded from compilation and breaks every layer's graph. Compilation itself happens
lazily on the first calls, which is the engine's warm-up, before the service reports ready. A
shape class first seen later (torch specialises sizes 0 and 1: the static engine's first batch of
more than one row after its one-row warm-up) compiles once when it first comes.

It pays without CUDA graphs too: one compiled call (guard checks, one launch) costs the host
less than eight eager launches. Plain ``generate()`` of the 7B at batch 1 on the H200 took
40.68 ms/token with compiled norms against 51.72 and 46.83 eager, in one process
(``loadtests/gpu/norms_ab.py``).
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn

log = logging.getLogger(__name__)


def wants_compiled_norms(setting: Literal["auto", "on", "off"], device: torch.device) -> bool:
    """``auto`` compiles on CUDA. On a CPU the fused kernel is faster too, but compiling costs
    seconds at every start, which the tests and the demo would pay for nothing."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def compile_norms(model: nn.Module) -> int:
    """Compile every RMSNorm module of ``model`` in place; returns how many.

    Matched by class name: every transformers model names its norm ``<Model>RMSNorm``.
    ``dynamic=True`` keeps the token count symbolic, so batches of any size reuse the graphs.
    """
    count = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.compile(dynamic=True)
            count += 1
    log.info("norms compiled", extra={"modules": count})
    return count
