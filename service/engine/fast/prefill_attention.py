"""Causal attention of packed prompts for the fast engine's prefill, on the kernel torch ships.

A prefill step lays its prompts (or chunks of them) end to end; each attends to its own keys only,
which include the ones already cached before a chunk. torch contains the FlashAttention-2 varlen
kernel (``aten._flash_attention_forward``: grouped-query attention native, causal masks aligned to
the end of each key sequence, as a chunk after cached keys needs) where the GPU's capability and
the dtype allow it (``capability.py``); elsewhere (a CPU, float32, a T4) SDPA computes the same
one prompt at a time, which also serves as the reference the kernel is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from service.engine.capability import Capability


def packed_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    flash: bool | None = None,
    host_starts: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """Causal attention of packed sequences, ``[tokens, heads, dim]`` in and out; each sequence's
    queries are the last positions of its keys. torch's flash kernel where ``flash`` (None: where
    the device's capability and the dtype allow it), SDPA one sequence at a time elsewhere, split
    at ``host_starts`` (``cu_q`` and ``cu_k`` on the host; else read back from the device)."""
    if flash is None:
        flash = Capability.of(q.device).flash_prefill(q.dtype)
    if flash:
        return _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale)
    if host_starts is None:
        host_starts = (cu_q.tolist(), cu_k.tolist())
    return _reference_varlen(q, k, v, host_starts[0], host_starts[1], scale)


def _flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
) -> torch.Tensor:
    # The aten op rather than torch.nn.attention.varlen.varlen_attn: the public wrapper prefers
    # cuDNN on some GPUs, and its cuDNN path refuses grouped-query attention (32 heads, 8 KV).
    output = torch.ops.aten._flash_attention_forward(
        q,
        k,
        v,
        cu_q.to(torch.int32),
        cu_k.to(torch.int32),
        max_q,
        max_k,
        0.0,  # dropout
        True,  # causal, aligned to the end of each key sequence
        False,  # return_debug_mask
        scale=scale,
    )[0]
    return output  # type: ignore[no-any-return]


def _reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts_q: Sequence[int],
    starts_k: Sequence[int],
    scale: float | None,
) -> torch.Tensor:
    outputs = []
    for i in range(len(starts_q) - 1):
        qi = q[starts_q[i] : starts_q[i + 1]].transpose(0, 1)
        ki = k[starts_k[i] : starts_k[i + 1]].transpose(0, 1)
        vi = v[starts_k[i] : starts_k[i + 1]].transpose(0, 1)
        new, total = qi.shape[1], ki.shape[1]
        if new == 0:
            continue  # an empty sequence (a captured step's shapes pad with them)
        # The queries are the last ``new`` positions of the sequence: causal from there.
        mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(total - new)
        out = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True
        )
        outputs.append(out.transpose(0, 1))
    # Rows past the last sequence are padding; their output is never read.
    padding = q.shape[0] - starts_q[-1]
    if padding:
        outputs.append(q.new_zeros(padding, *q.shape[1:]))
    return torch.cat(outputs)
