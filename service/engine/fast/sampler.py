"""Choosing each row's next token on the device: repetition penalty, temperature, top-k, top-p.

Everything is tensor work with no host synchronisation, so a decode step that ends in sampling
can be captured in a CUDA graph. The order and semantics are transformers': the repetition
penalty first (over the prompt and the tokens generated so far, each token once), then
temperature, top-k, and top-p over what top-k kept (a token stays while the probability ranked
above it is under ``top_p``; the first always stays). A greedy row takes the ``argmax`` of the
penalized logits, as ``generate()`` does.

The draw is the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``), which picks token ``i``
with probability ``p_i`` without a host-side multinomial. Sorting the whole vocabulary for every
row costs more than the rest of a small step, so where every sampled row's top-k is at most
``TOP_K_CAP`` only the top ``TOP_K_CAP`` logits are sorted (``torch.topk``); rows without a
top-k (or a larger one) use the full sort, ``full_sort_rows`` rows at a time (``sample_rows``):
its buffers (values, order, probabilities and their sums over the whole vocabulary) are a few
times the logits', and a wide batch sorted at once would need gigabytes set aside for a mode few
requests ask for. In a wide batch the top ``TOP_K_CAP`` can be taken in two stages instead
(``top_candidates``): the top of each chunk of the vocabulary, then the top of those, each a
selection over a short slice per block, where torch's selection over a whole row of a wide batch
makes several passes over every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from service.engine.fast.sequence import TOP_K_CAP

# Rows sorted at once by the full sort: an eighth of the decode rows, at least 16, at most this
# (``full_sort_rows``). Its buffers are set aside out of the KV cache's memory for a mode few
# requests ask for: at 128 rows over a 128,256-token vocabulary, sorting all of them at once
# would hold 1.58 GB of a 16 GiB card.
FULL_SORT_ROWS = 128
# The vocabulary's chunks of the two-stage top-k (``top_candidates``).
TOP_K_CHUNK = 1024


def full_sort_rows(rows: int) -> int:
    """Rows the full sort takes at once in an engine of ``rows`` decode rows."""
    return min(FULL_SORT_ROWS, max(16, rows // 8))


@dataclass(frozen=True, slots=True)
class RowSampling:
    """Per-row parameters, one entry per batch row."""

    greedy: torch.Tensor  # bool
    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0 = no cut-off
    top_p: torch.Tensor  # float32
    penalty: torch.Tensor  # float32, 1 = none
    seen: torch.Tensor  # bool [rows, vocab]: tokens of the prompt and the output so far

    def slice(self, start: int, end: int) -> RowSampling:
        """Rows ``start..end-1``."""
        return RowSampling(
            greedy=self.greedy[start:end],
            temperature=self.temperature[start:end],
            top_k=self.top_k[start:end],
            top_p=self.top_p[start:end],
            penalty=self.penalty[start:end],
            seen=self.seen[start:end],
        )


def penalize(logits: torch.Tensor, penalty: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """transformers' repetition penalty: seen tokens' logits divided (positive) or multiplied
    (negative) by the row's penalty."""
    factor = penalty[:, None]
    penalized = torch.where(logits < 0, logits * factor, logits / factor)
    return torch.where(seen, penalized, logits)


def race_noise(rows: int, vocab: int, full_sort: bool, device: torch.device) -> torch.Tensor:
    """The exponential draws of one step's race, ``[rows, width]``. Drawn by the eager code so
    that a compiled sampler holds no random state of its own inside a CUDA graph."""
    width = vocab if full_sort else min(TOP_K_CAP, vocab)
    return torch.empty(rows, width, dtype=torch.float32, device=device).exponential_()


def sample_rows(
    logits: torch.Tensor,
    rows: RowSampling,
    full_sort: bool,
    noise: torch.Tensor | None = None,
    at_once: int = FULL_SORT_ROWS,
    two_stage: bool = False,
) -> torch.Tensor:
    """``sample`` of every row; with ``full_sort``, ``at_once`` rows at a time (each slice
    draws its own noise where none is given)."""
    count = logits.shape[0]
    if not full_sort or count <= at_once:
        return sample(logits, rows, full_sort, noise, two_stage)
    parts = []
    for start in range(0, count, at_once):
        end = min(start + at_once, count)
        part_noise = None if noise is None else noise[start:end]
        parts.append(sample(logits[start:end], rows.slice(start, end), True, part_noise))
    return torch.cat(parts)


def sample(
    logits: torch.Tensor,
    rows: RowSampling,
    full_sort: bool,
    noise: torch.Tensor | None = None,
    two_stage: bool = False,
) -> torch.Tensor:
    """The next token of every row of float32 ``logits`` ``[rows, vocab]`` (``noise``: the race's
    draws from ``race_noise``, drawn here when not given; ``two_stage``: the top logits taken
    by ``top_candidates``' two stages)."""
    logits = penalize(logits, rows.penalty, rows.seen)
    greedy = first_argmax(logits)
    scaled = logits / rows.temperature[:, None]
    if full_sort:
        ordered, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    else:
        ordered, order = top_candidates(scaled, min(TOP_K_CAP, scaled.shape[-1]), two_stage)
    width = ordered.shape[-1]
    ranks = torch.arange(width, device=logits.device)
    limit = torch.where(rows.top_k > 0, rows.top_k, width)
    ordered = ordered.masked_fill(ranks >= limit[:, None], -torch.inf)
    probs = ordered.softmax(dim=-1)
    above = probs.cumsum(dim=-1) - probs
    cut = above >= rows.top_p[:, None]
    cut[:, 0] = False
    probs = probs.masked_fill(cut, 0.0)
    if noise is None:
        noise = torch.empty_like(probs).exponential_()
    race = probs / noise
    choice = race.argmax(dim=-1, keepdim=True)
    drawn = order.gather(-1, choice).squeeze(-1)
    return torch.where(rows.greedy, greedy, drawn)


def top_candidates(
    values: torch.Tensor, k: int, two_stage: bool, chunk: int = TOP_K_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of each row of ``values`` ``[rows, width]`` and their indices, largest
    first, as ``torch.topk`` gives them (but for the order of equal values); with
    ``two_stage``, the ``k`` largest of each ``chunk`` first, then the ``k`` largest of those."""
    if not two_stage or k > chunk or values.shape[-1] <= chunk:
        return torch.topk(values, k, dim=-1)
    chunks = _chunks(values, chunk)
    best, within = torch.topk(chunks, k, dim=-1)
    starts = torch.arange(chunks.shape[1], device=values.device) * chunk
    places = (within + starts[:, None]).flatten(1)
    ordered, picked = torch.topk(best.flatten(1), k, dim=-1)
    # The padding's -inf is picked only by a row with fewer than ``k`` finite values, in a
    # place whose -inf no draw takes: its index is clamped into the vocabulary all the same.
    return ordered, places.gather(-1, picked).clamp(max=values.shape[-1] - 1)


def first_argmax(values: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``values.argmax(-1)`` (the first index of the largest value) as two reductions: each
    chunk's first maximum, then the first chunk holding the largest. Compiled at one row, the
    single reduction over the vocabulary runs in one block; the first one here runs in one
    block per chunk."""
    chunks = _chunks(values, chunk)
    within = chunks.argmax(dim=-1)
    best = chunks.gather(-1, within[..., None]).squeeze(-1)
    first = best.argmax(dim=-1, keepdim=True)
    return (first * chunk + within.gather(-1, first)).squeeze(-1)


def _chunks(values: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[rows, width]`` as ``[rows, chunks, chunk]``, the last chunk padded with -inf (which no
    maximum picks over a finite value)."""
    rows, width = values.shape
    padded = (-width) % chunk
    if padded:
        values = torch.nn.functional.pad(values, (0, padded), value=-torch.inf)
    return values.view(rows, -1, chunk)
