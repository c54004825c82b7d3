"""A request as the fast engine's scheduler holds it, and its sampling parameters as numbers.

No torch: the scheduler and its tests use these without a device; the model runner turns the
parameters into the decode rows' tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.contract.types import Decoding

# Top-k cut-offs up to this sort only the top logits; larger ones (or none) sort the vocabulary.
TOP_K_CAP = 64


@dataclass(frozen=True, slots=True)
class RowParameters:
    """One request's sampling parameters, as its decode row holds them."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    penalty: float

    @classmethod
    def of(cls, decoding: Decoding) -> RowParameters:
        if decoding.greedy:
            return cls(True, 1.0, 1, 1.0, float(decoding.repetition_penalty))
        return cls(
            False,
            float(decoding.temperature),
            int(decoding.top_k),
            float(decoding.top_p),
            float(decoding.repetition_penalty),
        )

    @property
    def full_sort(self) -> bool:
        """Whether sampling this row needs the whole vocabulary sorted."""
        return needs_full_sort(self.greedy, self.top_k)


def needs_full_sort(greedy: bool, top_k: int) -> bool:
    """Whether a row's parameters need the whole vocabulary sorted."""
    return not greedy and not 0 < top_k <= TOP_K_CAP


@dataclass(eq=False, slots=True)
class Sequence:
    """One request from its admission to its end: its prompt, its budget, the pages it holds and
    how far its prefill has gone. Times are ``time.monotonic()``."""

    request_id: str
    prompt: tuple[int, ...]
    max_new: int
    parameters: RowParameters
    streams: bool
    submitted: float
    # Past it (``time.monotonic()``), a request still waiting is dropped before the model.
    deadline: float | None = None
    started: float = 0.0
    pages: list[int] = field(default_factory=list)
    committed: int = 0
    prefilled: int = 0
    # Leading prompt tokens copied from kept prefixes instead of prefilled.
    reused: int = 0
    cancelled: bool = False
