"""The mixture-of-experts block of Hy-MT2-30B-A3B (``hy_v3``), over tensors the fast engine holds.

Operation for operation transformers' ``HYV3MoE`` with its default ``grouped_mm`` experts:

- the router in float32: sigmoid scores, the top ``k`` chosen with the correction bias added,
  their weights normalised and scaled;
- every token's ``k`` expert rows sorted by expert and run as two grouped GEMMs (gate/up, then
  down), weighted, put back in order and summed per token in float32;
- the shared expert added (in float32 where the config says so).

No step reads a value back to the host (expert counts go through ``histc``, as in transformers),
so in bf16 a decode step with this block can be captured in a CUDA graph. In other dtypes the
grouped GEMM itself reads the counts back (torch has its kernel for bf16 only), so the engine
captures no graphs there (``plan.plan_for``).
"""

from __future__ import annotations

import torch
from transformers.integrations.moe import _grouped_mm

from service.engine.fast.projections import gated_product, project
from service.engine.fast.weights import MoeWeights


def moe_block(x: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    """``[tokens, hidden]`` -> the same shape."""
    tokens, hidden = x.shape
    scores = torch.sigmoid(torch.nn.functional.linear(x.float(), w.router.float()))
    _, chosen = torch.topk(scores + w.correction, w.top_k, dim=-1, sorted=False)
    weights = scores.gather(1, chosen)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * w.scaling

    experts = w.gate_up.shape[0]
    expert_ids, order = torch.sort(chosen.reshape(-1))
    rows = x[order // w.top_k]
    counts_input = expert_ids.float() if x.device.type in ("cpu", "mps") else expert_ids.int()
    counts = torch.histc(counts_input, bins=experts, min=0, max=experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    gate, up = _grouped_mm(rows, w.gate_up.transpose(-2, -1), offsets).chunk(2, dim=-1)
    out = _grouped_mm(torch.nn.functional.silu(gate) * up, w.down.transpose(-2, -1), offsets)
    weighted = out * weights.reshape(-1)[order].unsqueeze(-1)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=x.device)
    routed = weighted[inverse].view(tokens, w.top_k, hidden).sum(dim=1).to(x.dtype)

    shared = project(gated_product(x, w.shared_gate_up), w.shared_down)
    if w.fp32_combine:
        return (routed.float() + shared.float()).to(x.dtype)
    return routed + shared
