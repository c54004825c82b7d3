"""What the translation domain works with: its config, the requests it prepares, the results it
gives, the two ports it needs (preparation off the event loop, generation), and the token budget
of a text."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.contract.errors import ServiceError
from service.contract.types import (
    MODEL_CARD_DECODING,
    Decoding,
    GenerationRequest,
    Scheduled,
    TextSink,
)
from service.frontend.translation.detection import Detection
from service.frontend.translation.languages import Language
from service.frontend.translation.markup import Segmented
from service.frontend.translation.prompts import PLAIN, TranslationOptions
from service.frontend.translation.segments import Document
from service.frontend.translation.tags import Numbered


@dataclass(frozen=True, slots=True)
class TranslationConfig:
    """The translator's limits, token budget and cache (from the service's settings)."""

    decoding: Decoding = MODEL_CARD_DECODING
    max_text_chars: int = 5000
    max_input_tokens: int = 2048
    # Most tokens of a whole prompt: the text, the options' parts and the template together.
    max_prompt_tokens: int = 4096
    max_batch_items: int = 64
    max_new_tokens: int = 1024
    output_tokens_ratio: float = 2.0
    output_tokens_margin: int = 16
    log_texts: bool = False
    cache_size: int = 10_000
    cache_ttl_s: float = 3600.0
    warmup: bool = True
    prepare_niceness: int = 10  # added to the preparation workers' nice value
    prepare_timeout_s: float = 30.0  # a worker holding jobs and answering none this long: hung
    family: str = "hunyuan-mt"  # the model family whose templates build the prompts
    # A text over max_text_chars and up to this is translated as a document, segment by segment.
    max_document_chars: int = 50_000
    # The model begins its answers with a think block (Hy-MT2-30B-A3B): taken out.
    think_tags: bool = False


class TextPreparer(Protocol):
    """Runs the per-text CPU work off the event loop (``Preparer``: worker processes)."""

    async def prepare(
        self,
        texts: Sequence[str],
        target: Language,
        source: Language | None,
        fields: Sequence[str],
        options: TranslationOptions = PLAIN,
    ) -> list[Prepared]: ...

    async def render(
        self, text: str, target: Language, source: Language | None, options: TranslationOptions
    ) -> tuple[Prepared, str]:
        """The request for ``text`` and the exact text the model would read (chat format)."""
        ...

    async def split(self, text: str, max_chars: int, hard_chars: int) -> Document:
        """``segments.split_document`` of a long text (milliseconds: not on the event loop),
        its segments within the tokens a text may have."""
        ...

    async def segment(
        self, documents: Sequence[str], ignore: Sequence[str], inline: Iterable[str]
    ) -> list[Segmented]:
        """``markup.segment`` of each HTML or XML document (a second of CPU a megabyte)."""
        ...

    async def prepare_chat(
        self, content: str, decoding: Decoding, max_new_tokens: int
    ) -> Prepared: ...

    async def detect(self, texts: Sequence[str]) -> list[Detection]: ...


class Generator(Protocol):
    """What the translator needs to turn a request into a result (``Dispatcher``)."""

    async def generate(
        self,
        request: GenerationRequest,
        deadline: float | None = None,
        on_text: TextSink | None = None,
    ) -> Scheduled: ...


@dataclass(frozen=True, slots=True)
class Translation:
    """One translated text with the languages used, its token usage and where time went."""

    text: str
    source: Language | None
    target: Language
    detected_confidence: float | None
    input_tokens: int
    output_tokens: int
    cache: str  # "hit", "shared", "miss", or "bypass" (not language: answered as it is)
    queue_s: float
    inference_s: float
    # Other translations sampled for the same text (LibreTranslate's ``alternatives``), distinct
    # from ``text`` and from each other; empty unless asked for.
    alternatives: tuple[str, ...] = ()
    # The translation was detected, surely, in another language than the target.
    target_mismatch: bool = False


def every_translation(outcomes: Sequence[Translation | ServiceError]) -> list[Translation]:
    """A batch's translations, or the first error among them (a dialect that answers a request
    whole, not text by text)."""
    done: list[Translation] = []
    for outcome in outcomes:
        if isinstance(outcome, ServiceError):
            raise outcome
        done.append(outcome)
    return done


@dataclass(frozen=True, slots=True)
class Completion:
    """The model's answer to a chat prompt given as it is (the OpenAI-compatible API)."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str  # "stop" (end of turn) or "length" (the token budget ran out)
    cache: str  # as a translation's; "bypass" for a stream (never cached)
    queue_s: float
    inference_s: float
    cached_tokens: int = 0  # of the input tokens, those from a kept prefix


@dataclass(frozen=True, slots=True)
class Prepared:
    """One validated text turned into the exact generation request, with its cache key."""

    source: Language | None
    prompt: str
    key: tuple[object, ...]
    request: GenerationRequest
    # Set when the source language was detected rather than given.
    detected_confidence: float | None = None
    # Set for markup sent with numbered tags: turns the answer's tags back into the original.
    restore: Numbered | None = None


def token_budget(source_tokens: int, settings: TranslationConfig) -> int:
    """Most tokens generated for a text of ``source_tokens`` tokens.

    ``min(max_new_tokens, ceil(output_tokens_ratio * source_tokens) + output_tokens_margin)``:
    the model stops earlier at EOS; a model that never emits EOS (random weights) runs exactly to
    this budget, which makes a benchmark's work a known function of its inputs.
    """
    budget = math.ceil(settings.output_tokens_ratio * source_tokens) + settings.output_tokens_margin
    return max(1, min(settings.max_new_tokens, budget))


def combined(
    text: str,
    parts: Sequence[Translation],
    source: Language | None,
    target: Language,
    confidence: float | None,
) -> Translation:
    """One translation made of ``parts`` (a document's segments, a markup's runs): their
    tokens summed, the slowest one's times, a cache hit only when every part was one."""
    return Translation(
        text=text,
        source=source,
        target=target,
        detected_confidence=confidence,
        input_tokens=sum(t.input_tokens for t in parts),
        output_tokens=sum(t.output_tokens for t in parts),
        cache="hit" if all(t.cache == "hit" for t in parts) else "miss",
        queue_s=max((t.queue_s for t in parts), default=0.0),
        inference_s=max((t.inference_s for t in parts), default=0.0),
    )


def as_is(text: str, source: Language | None, target: Language) -> Translation:
    """The answer for a text that is not language (``verbatim``): itself, at no cost."""
    return Translation(
        text=text,
        source=source,
        target=target,
        detected_confidence=None,
        input_tokens=0,
        output_tokens=0,
        cache="bypass",
        queue_s=0.0,
        inference_s=0.0,
    )


class InBatches(Protocol):
    """``translate_batch`` for any number of texts (``Translator._in_batches``)."""

    async def __call__(
        self,
        texts: Sequence[str],
        target_lang: str,
        source_lang: str | None,
        deadline: float | None,
        paced: bool = False,
    ) -> list[Translation | ServiceError]: ...


class TranslateOne(Protocol):
    """One text translated whole (``Translator.translate``)."""

    async def __call__(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        options: TranslationOptions = PLAIN,
    ) -> Translation: ...
