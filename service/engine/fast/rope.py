"""A decode step's attention inputs after the QKV projection as one kernel of the engine's own.

After the fused QKV projection of a decode step, transformers' order of operations is: split the
row into query, key and value heads, rotate queries and keys (RoPE), normalise them per head
(before or after the rotation, by model), and the engine then writes keys and values to their
cache slots. Compiled, inductor makes three kernels of that per layer (queries, keys with their
cache write, values with theirs), each too small to fill the GPU, so at one row their launches
and the gaps between them cost more than their work. ``rope_and_store`` is one launch: one
program per row and head (query heads, key heads, value heads), each reading its head's slice of
the QKV row, its row's RoPE entries and norm weight, and writing either the query to the output
or the key or value to its cache slot. Each product and sum is rounded to the model's dtype
where the eager code rounds it, as inductor does under ``emulate_precision_casts``.

The kernel is in ``rope_kernel.py``; ``runs`` says where the engine takes it
(``HYMT_FAST_FUSED_ROPE``), elsewhere it keeps the compiled torch code.
"""

from __future__ import annotations

from typing import Any

import torch

from service.engine.fast.cache import KV_FP8
from service.engine.fast.launch import pdl_args
from service.engine.fast.weights import Geometry

# Bound at import, as ``gemv`` binds its kernel: nothing to look up inside compiled code.
_kernel: Any
try:
    from service.engine.fast.rope_kernel import rope_store as _kernel
except ImportError:  # no Triton (a CPU build of torch)
    _kernel = None

# Batches up to this many rows give every head a program; wider ones this many heads each.
_ONE_HEAD_UP_TO = 16
_HEADS_PER_PROGRAM = 8


def built() -> bool:
    """Whether Triton is there to build the kernel (a CPU build of torch has none)."""
    return _kernel is not None


def runs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the engine takes the kernel for a model of ``dtype`` on ``device``: 16-bit on
    CUDA, with Triton present, as the one-row projections (``gemv.runs``); float32 keeps the
    torch code, which the float32 fidelity check compares token for token. (The kernel itself
    runs in any dtype, and on a CPU in Triton's interpreter, as the tests run it.)"""
    return built() and device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)


def rope_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    query_norm: torch.Tensor | None,
    key_norm: torch.Tensor | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    g: Geometry,
    pdl: bool = False,
) -> torch.Tensor:
    """The queries ``[rows, heads, head_dim]`` of a fused QKV product ``[rows, (heads + 2 *
    kv_heads) * head_dim]``, rotated by ``cos`` and ``sin`` (``[rows, head_dim]``) and
    normalised per head when the model has query and key norms; the rows' keys (treated the
    same way) and values written to ``slots`` of one layer's caches (``[kv_heads, slots,
    head_dim]``). ``pdl``: launched with programmatic dependent launch (``launch.py``)."""
    rows = qkv.shape[0]
    out = torch.empty(rows, g.heads, g.head_dim, dtype=qkv.dtype, device=qkv.device)
    normed = query_norm is not None and key_norm is not None
    total = g.heads + 2 * g.kv_heads
    # A lone row's heads each get a program (latency); a wide batch's row takes its heads a
    # few to a program, so tens of thousands of one-warp programs of 256 bytes each do not
    # cost more to schedule than their work.
    per_program = 1 if rows <= _ONE_HEAD_UP_TO else _HEADS_PER_PROGRAM
    grid = (rows, -(-total // per_program))
    _kernel[grid](
        qkv,
        cos,
        sin,
        qkv if query_norm is None else query_norm,
        qkv if key_norm is None else key_norm,
        slots,
        key_cache,
        value_cache,
        out,
        qkv.stride(0),
        cos.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
        out.stride(0),
        out.stride(1),
        eps=g.eps,
        heads=g.heads,
        kv_heads=g.kv_heads,
        half=g.head_dim // 2,
        qk_norm=normed,
        norm_first=g.norm_before_rope,
        per_program=per_program,
        fp8_cache=key_cache.dtype == KV_FP8,
        num_warps=1,
        **pdl_args(pdl, qkv.device),
    )
    return out
