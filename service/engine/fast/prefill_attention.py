"""Causal attention of packed prompts for the fast engine's prefill, on the kernels torch ships.

A prefill step lays its prompts (or chunks of them) end to end; each attends to its own keys only,
which include the ones already cached before a chunk. torch contains the FlashAttention-2 varlen
kernel (``aten._flash_attention_forward``: grouped-query attention native, causal masks aligned to
the end of each key sequence, as a chunk after cached keys needs) and, for the GPUs it does not
run on (a T4's compute capability 7.5), the memory-efficient varlen kernel
(``aten._efficient_attention_forward``, xformers' CUTLASS kernel: the same sequences by their
starts on the device, causal from the bottom right, keys at the queries' head count). Both are one
launch a layer with no read back to the host, so a CUDA graph holds them. Elsewhere (a CPU,
float32) SDPA computes the same one prompt at a time, split on the host, which also serves as the
reference the kernels are tested against. ``capability.py`` chooses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from service.engine.capability import Capability, PrefillKernel

# ``_efficient_attention_forward``'s mask over each sequence: causal with the last query on the
# last key (xformers' ``BlockDiagonalCausalFromBottomRightMask``; torch's ``CausalVariant``).
_CAUSAL_FROM_BOTTOM_RIGHT = 2


def packed_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    kernel: PrefillKernel | None = None,
    host_starts: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """Causal attention of packed sequences, ``[tokens, heads, dim]`` in and out; each sequence's
    queries are the last positions of its keys. By ``kernel`` (None: the one the device's
    capability and the dtype allow); SDPA splits the sequences at ``host_starts`` (``cu_q`` and
    ``cu_k`` on the host; else read back from the device)."""
    if kernel is None:
        kernel = Capability.of(q.device).prefill_kernel(q.dtype)
    if kernel != "sdpa":
        return _varlen(
            kernel, q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, scale
        )
    if host_starts is None:
        host_starts = (cu_q.tolist(), cu_k.tolist())
    return _reference_varlen(q, k, v, host_starts[0], host_starts[1], scale)


def _varlen(
    kernel: PrefillKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
) -> torch.Tensor:
    """The packed sequences by one of torch's varlen kernels, their starts (``cu_q``, ``cu_k``:
    int32) on the device."""
    if kernel == "flash":
        # The aten op rather than torch.nn.attention.varlen.varlen_attn: the public wrapper
        # prefers cuDNN on some GPUs, and its cuDNN path refuses grouped-query attention (32
        # heads, 8 KV).
        flash = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k,
            0.0,  # dropout
            True,  # causal, aligned to the end of each key sequence
            False,  # return_debug_mask
            scale=scale,
        )  # fmt: skip
        return flash[0]  # type: ignore[no-any-return]
    # The memory-efficient kernel reads a head of keys for each head of queries: grouped-query
    # keys and values are repeated to the queries' heads (a prefill step's keys, a copy far
    # smaller than the attention's work).
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    # One batch of the packed tokens, ``[1, tokens, heads, dim]``; rows past the last sequence
    # are padding, never written or read.
    efficient = efficient_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
        None,  # bias
        cu_q, cu_k, max_q, max_k,
        0.0,  # dropout
        _CAUSAL_FROM_BOTTOM_RIGHT,
        False,  # compute_log_sumexp
        scale=scale,
    )  # fmt: skip
    return efficient[0].squeeze(0)


def efficient_attention(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    """``aten._efficient_attention_forward`` (CUDA only; a test's stand-in takes its place)."""
    return torch.ops.aten._efficient_attention_forward(*args, **kwargs)  # type: ignore[no-any-return]


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
