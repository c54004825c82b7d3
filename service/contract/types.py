"""The engine's contract: what a generation request and result are, and what an engine does.

The engine host speaks only this interface, so a fake engine can stand in for tests, and the
API process builds requests and reads results without the engine's code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from service.contract.errors import ServiceError

if TYPE_CHECKING:
    from service.contract.tokenizer import TokenizerSpec


# Where the sampling arithmetic stays defined in float32: logits divided by a temperature or a
# repetition penalty below these overflow to infinity (and softmax then gives NaN); a top-k
# beyond any vocabulary is no cut-off, and a larger integer overflows the engine's int64.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
MIN_REPETITION_PENALTY = 1e-2
MAX_REPETITION_PENALTY = 100.0
MAX_TOP_K = 1 << 20


@dataclass(frozen=True, slots=True)
class Decoding:
    """How tokens are chosen. Part of the cache key, so it is hashable.

    Values a client may send are clamped where the arithmetic is defined: a temperature below
    ``MIN_TEMPERATURE`` is greedy decoding (which it approaches anyway), a top-k above
    ``MAX_TOP_K`` is none (0)."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float

    def __post_init__(self) -> None:
        clamp = functools.partial(object.__setattr__, self)
        if not self.greedy and not self.temperature >= MIN_TEMPERATURE:
            clamp("greedy", True)
        if not self.temperature >= MIN_TEMPERATURE:
            clamp("temperature", 1.0)
        elif self.temperature > MAX_TEMPERATURE:
            clamp("temperature", MAX_TEMPERATURE)
        if not 0 <= self.top_k <= MAX_TOP_K:
            clamp("top_k", 0)
        if not 0 < self.top_p <= 1:
            clamp("top_p", 1.0)
        penalty = self.repetition_penalty
        if not MIN_REPETITION_PENALTY <= penalty <= MAX_REPETITION_PENALTY:
            bounded = min(max(penalty, MIN_REPETITION_PENALTY), MAX_REPETITION_PENALTY)
            clamp("repetition_penalty", bounded if penalty == penalty else 1.0)


# Tencent's recommended sampling for the Hunyuan-MT models (their model cards).
MODEL_CARD_DECODING = Decoding(
    greedy=False, temperature=0.7, top_k=20, top_p=0.6, repetition_penalty=1.05
)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One prompt, already tokenized with the chat template, and its token budget."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    decoding: Decoding


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The decoded new text of one request and the tokens it took."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    # Of the prompt tokens, those whose keys and values the engine copied from a kept prefix
    # instead of computing them (OpenAI's ``usage.prompt_tokens_details.cached_tokens``).
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A generation result with the time it spent waiting and running."""

    result: GenerationResult
    queue_s: float
    inference_s: float


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the loaded model is; the fingerprint goes into every cache key."""

    model: str
    revision: str | None
    dtype: str
    quantization: str
    device: str
    load_seconds: float
    weights_bytes: int
    attention: str = "sdpa"

    @property
    def fingerprint(self) -> str:
        return f"{self.model}@{self.revision or '-'}:{self.dtype}:{self.quantization}"


class PromptEncoder(Protocol):
    """Turns a user message into the model's chat-formatted token ids.

    Thread-safe: the translator's preparation workers call it to validate lengths and build
    requests before anything is queued.
    """

    def encode_chat(self, content: str) -> tuple[int, ...]:
        """Token ids of one user turn in the chat template, content tokenized as plain text."""
        ...

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` alone, special-token strings counted as plain text."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` with special tokens written out (what the model reads)."""
        ...


# The parts of an engine's step loop, in the order a step runs them (``Engine.loop_seconds``):
# launching a prefill (its kernels or graph); the rest of a prefill (planning, the wait for its
# first tokens, their join); launching a decode step; waiting for the step before it (the host
# idle while the device works); the host's own work on the tokens (rows, finished requests,
# text, answers).
LOOP_PARTS = ("prefill_launch", "prefill_other", "decode_launch", "wait", "host")

# Receives (result or error, seconds queued inside the engine, seconds generating).
Completion = Callable[[GenerationResult | ServiceError, float, float], None]
# Receives the text generated so far while a streamed request runs: a prefix of the final text
# (held back: trailing whitespace and an incomplete character), called each time it grows.
TextSink = Callable[[str], None]


@runtime_checkable
class Engine(Protocol):
    """A loaded model that takes requests one at a time into a batch running step by step.

    ``submit`` and ``cancel`` are called on the event loop; ``on_done`` is called back there.
    """

    @property
    def info(self) -> EngineInfo: ...

    @property
    def tokenizer(self) -> TokenizerSpec:
        """The tokenizer side of the model, for building requests before they are queued."""
        ...

    def memory_bytes(self) -> dict[str, int]:
        """Accelerator memory in use by kind (e.g. allocated, reserved); empty on CPU."""
        ...

    def capacity(self) -> int | None:
        """Most requests per step, once the engine has decided it."""
        ...

    def running(self) -> int | None:
        """Requests generating now, None where the engine cannot tell."""
        ...

    def steps(self) -> int | None:
        """Model steps taken since start (each prefill or decode pass), None where the engine
        cannot tell: how the supervisor tells a working engine from a wedged one."""
        ...

    def step_seconds(self) -> dict[int, float]:
        """Seconds of one decode step by batch size, as the engine measured them at start
        (empty where it did not): admission's estimate before any answer has come back."""
        ...

    def device_seconds(self) -> float | None:
        """Seconds the accelerator has worked on the engine's steps since start, None where
        the engine does not time them (off a GPU)."""
        ...

    def loop_seconds(self) -> dict[str, float]:
        """Seconds the host's step loop has spent since start, by part (``LOOP_PARTS``; empty
        where the engine does not time its loop): set beside the wall time and the device's
        seconds, where a step's time goes and whether the device waits for the host."""
        ...

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
        deadline: float | None = None,
    ) -> None:
        """``on_text``: stream the text as it grows (an engine that cannot leaves it unused).
        ``deadline`` (``time.monotonic()``): a request still waiting when it passes is answered
        ``DeadlineExceeded`` and never reaches the model."""
        ...

    def cancel(self, request_id: str) -> None: ...

    def is_alive(self) -> bool:
        """Whether the generation thread is running."""
        ...

    def close(self) -> None:
        """Stop the generation thread (blocking; call it off the event loop)."""
        ...
