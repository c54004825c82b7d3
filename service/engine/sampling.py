"""Per-request sampling for transformers' continuous batching: temperature, top-k and top-p of
each request applied to its row of logits in one pass.

transformers' own per-request processors (5.24) sort the whole vocabulary twice per step (once for
top-k, once for top-p); this sorts it once and reads both cut-offs off that order, the cost of the
single-configuration top-p it replaces. Same semantics as transformers' warpers applied in
transformers' order (temperature, then top-k, then top-p over what top-k kept, at least one token
kept), so a request with top-k 1 gets the token ``argmax`` would pick.

It stands in for the manager's ``ContinuousBatchingLogitsProcessorList``: the manager asks it for
the number of per-request rows it needs, fills them from each request's ``logit_processor_kwargs``
(``add_request(..., temperature=, top_k=, top_p=)``) and calls it on every step's logits.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

from service.contract.types import Decoding

# No top-k cut-off: larger than any vocabulary, and still an int32.
NO_TOP_K = 2**31 - 1


def request_kwargs(decoding: Decoding) -> dict[str, float | int]:
    """One request's sampling values, as ``add_request`` takes them."""
    if decoding.greedy:
        return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    return {
        "temperature": float(decoding.temperature),
        "top_k": int(decoding.top_k) if decoding.top_k > 0 else NO_TOP_K,
        "top_p": float(decoding.top_p),
    }


class PerRequestSampling(ContinuousBatchingLogitsProcessorList):
    """Three int32 rows per step: temperature (float32 bits), top-k, top-p (float32 bits)."""

    _keys = ("temperature", "top_k", "top_p")

    def __init__(self, defaults: Decoding) -> None:
        # The base class would build transformers' processors; none of them is used here.
        self.logits_processor = LogitsProcessorList()
        self.tensors_required = len(self._keys)
        self.supported_keys = {"temperature": float, "top_k": int, "top_p": float}
        self.ignored_keys: set[str] = set()
        self.do_processing = True
        self._defaults = request_kwargs(defaults)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        for row, key in enumerate(self._keys):
            int32_tensor[row].copy_(_as_int32(torch.tensor([self._defaults[key]]), key))

    def prepare_tensor_args(
        self, requests_in_batch: list[Any], arg_storage: torch.Tensor
    ) -> torch.Tensor:
        states = [request.state for request in requests_in_batch if request.has_new_token]
        for row, key in enumerate(self._keys):
            default = self._defaults[key]
            values = [state.logit_processor_kwargs.get(key, default) for state in states]
            tensor = torch.tensor(values, dtype=torch.int32 if key == "top_k" else torch.float32)
            arg_storage[row, : len(values)] = _as_int32(tensor, key).to(arg_storage.device)
        return arg_storage

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, logits_processor_args: torch.Tensor
    ) -> torch.Tensor:
        rows = scores.size(0)
        temperature = logits_processor_args[0, :rows].view(torch.float32)
        top_k = logits_processor_args[1, :rows]
        top_p = logits_processor_args[2, :rows].view(torch.float32)
        scores = scores / temperature.unsqueeze(-1)
        # Stable: among equal logits the lowest token id ranks first, as argmax picks it.
        ordered, order = torch.sort(scores, dim=-1, descending=True, stable=True)
        ranks = torch.arange(scores.size(-1), device=scores.device)
        ordered = ordered.masked_fill(ranks >= top_k.unsqueeze(-1), -torch.inf)
        probs = ordered.softmax(dim=-1)
        # A token stays while the mass ranked above it is under top_p (the first always stays).
        above = probs.cumsum(dim=-1) - probs
        cut = above >= top_p.unsqueeze(-1)
        cut[:, 0] = False
        ordered = ordered.masked_fill(cut, -torch.inf)
        return torch.full_like(scores, -torch.inf).scatter(-1, order, ordered)


def _as_int32(tensor: torch.Tensor, key: str) -> torch.Tensor:
    """The storage is int32: floats travel as their bits."""
    if key == "top_k":
        return tensor.to(torch.int32)
    return tensor.to(torch.float32).view(torch.int32)
