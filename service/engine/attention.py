"""Packed variable-length attention for continuous batching, on the kernel torch ships.

transformers' continuous batching packs every request of a step into one sequence. With SDPA it
then builds a block-diagonal mask over *all* keys of the step and attends every query to every
key of every request: work and memory grow with (tokens in the step) x (KV tokens of all running
requests). With a flash implementation it instead calls a varlen kernel that sees each
request's own keys only (``cu_seq_lens``), several times faster (docs/benchmarks.md). That path
normally needs the ``flash-attn`` package (a CUDA build per torch version, absent on machines
without internet), but
torch itself contains the FlashAttention-2 varlen kernel (``aten._flash_attention_forward``, GQA
native, causal masks aligned bottom-right as a decode step needs). This module plugs that kernel
into transformers' attention interface. Off CUDA it computes the same thing one request at a time
with SDPA, so the path is testable on a CPU and doubles as the reference.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from service.engine.capability import HALF, Capability

# The name must contain "flash": that is how transformers' continuous batching decides to pack
# requests without a dense mask and to pass ``cu_seq_lens_*`` (``is_flash_attention_requested``).
VARLEN_ATTENTION = "flash_varlen_torch"


def varlen_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why torch's flash kernel cannot run here, or None when it can.

    Off CUDA the reference path always can. On CUDA the kernel needs an Ampere or newer GPU
    (compute capability 8.0: not the T4 of the article, 7.5) and half precision.
    """
    capability = Capability.of(device)
    if not capability.cuda or capability.flash_prefill(dtype):
        return None
    if dtype in HALF:
        major, minor = capability.version
        return f"torch's flash kernel needs compute capability 8.0; this GPU has {major}.{minor}"
    return f"torch's flash kernel needs float16 or bfloat16, not {dtype}"


def wants_varlen(setting: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the ``cb_attention`` setting means varlen attention on this device and dtype.

    ``auto`` picks it on CUDA where the kernel runs and falls back to SDPA elsewhere; an explicit
    ``varlen`` that cannot run is refused at load instead of failing the first translation.
    """
    if setting == "sdpa":
        return False
    reason = varlen_unsupported(device, dtype)
    if setting == "varlen":
        if reason is not None:
            raise RuntimeError(f"cb_attention=varlen: {reason}")
        return True
    return device.type == "cuda" and reason is None


def use_varlen_attention(model: PreTrainedModel) -> None:
    """Make ``model`` compute attention with :func:`varlen_attention_forward`.

    The function is registered in transformers' attention and mask registries (process-wide
    tables by transformers' design; registering twice is harmless). ``set_attn_implementation``
    is not used: for any name containing "flash" it insists on importing the ``flash-attn``
    package, which this implementation exists to do without.
    """
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    # Packed sequences carry no padding mask: the flash mask builder returns none.
    AttentionMaskInterface.register(
        VARLEN_ATTENTION,
        AttentionMaskInterface._global_mapping["flash_attention_2"],  # type: ignore[arg-type]
    )
    model.config._attn_implementation_internal = VARLEN_ATTENTION


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of packed sequences; the signature of transformers' attention interface.

    ``query`` is ``[1, heads, tokens, head_dim]``, ``key``/``value`` ``[1, kv_heads, kv_tokens,
    head_dim]`` (the cache has already been updated by the model). Returns ``[1, tokens, heads,
    head_dim]`` as every transformers attention function does.
    """
    if (
        cu_seq_lens_q is None
        or cu_seq_lens_k is None
        or max_length_q is None
        or max_length_k is None
    ):
        raise ValueError(f"{VARLEN_ATTENTION} serves packed (continuous batching) inputs only")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [tokens, heads, dim]
    out = packed_causal_attention(
        q, k, v, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, scaling
    )
    return out.unsqueeze(0), None


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
) -> torch.Tensor:
    """Causal attention of packed sequences, ``[tokens, heads, dim]`` in and out; each sequence's
    queries are the last positions of its keys. torch's flash kernel where ``flash`` (None: where
    the device's capability and the dtype allow it), SDPA one sequence at a time elsewhere."""
    if flash is None:
        flash = Capability.of(q.device).flash_prefill(q.dtype)
    if flash:
        return _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale)
    return _reference_varlen(q, k, v, cu_q, cu_k, scale)


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
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    scale: float | None,
) -> torch.Tensor:
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    outputs = []
    for i in range(len(starts_q) - 1):
        qi = q[starts_q[i] : starts_q[i + 1]].transpose(0, 1)
        ki = k[starts_k[i] : starts_k[i + 1]].transpose(0, 1)
        vi = v[starts_k[i] : starts_k[i + 1]].transpose(0, 1)
        new, total = qi.shape[1], ki.shape[1]
        # The queries are the last ``new`` positions of the sequence: causal from there.
        mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(total - new)
        out = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True
        )
        outputs.append(out.transpose(0, 1))
    # Rows past the last sequence are padding (transformers pads steps to fixed sizes for CUDA
    # graphs); their output is never read.
    padding = q.shape[0] - starts_q[-1]
    if padding:
        outputs.append(q.new_zeros(padding, *q.shape[1:]))
    return torch.cat(outputs)
