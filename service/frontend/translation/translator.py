"""The translation domain: admit, validate, build the prompt, consult the cache, generate.

Every API dialect calls ``Translator``; it knows nothing of HTTP. A request is admitted first
(O(1), ``policy.admission``), before any per-text work; then its texts are validated,
language-detected and tokenized in a worker pool, never on the event loop that answers
``/health`` and refusals. One text becomes one prompt in the Hunyuan-MT template, encoded with
the chat template, with a token budget that is a documented function of the source length.
Batches are validated whole before any generation starts (an error names the offending index),
then cached and generated item by item, so a repeated text inside a batch is a cache hit and a
batch's texts can share batches with other requests' texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.contract.errors import (
    BatchTooLarge,
    InvalidInput,
    ServiceError,
    TextTooLong,
)
from service.contract.types import (
    MODEL_CARD_DECODING,
    Decoding,
    GenerationRequest,
    GenerationResult,
    PromptEncoder,
    Scheduled,
    TextSink,
)
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission, Reservation, patiently
from service.frontend.translation.cache import ResultCache
from service.frontend.translation.detection import (
    MISMATCH_LETTERS,
    Detection,
    LanguageDetector,
    letters,
    target_mismatch,
)
from service.frontend.translation.families import FAMILIES
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.markup import Segmented, segment, tag_sequence
from service.frontend.translation.prompts import (
    PLAIN,
    PromptFormat,
    TranslationOptions,
    check_options,
    looks_chinese,
    option_parts,
)
from service.frontend.translation.segments import Document
from service.frontend.translation.tags import Numbered, number_tags
from service.frontend.translation.thinking import ThoughtFilter, without_thoughts
from service.frontend.translation.verbatim import verbatim

log = logging.getLogger(__name__)

# An uploaded document's share of the admission bound (see ``Translator._pace``).
_PACE_SHARE = 4
# The longest segment of a document (a line, or a run of a long line's sentences).
_SEGMENT_CHARS = 1000
# The start of a document its source language is detected from.
_DETECT_CHARS = 4000


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

    async def split(self, text: str, max_chars: int) -> Document:
        """``segments.split_document`` of a long text (milliseconds: not on the event loop)."""
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


class PromptBuilder:
    """Validates one text and turns it into the exact request the model receives.

    Shared by the translator and by whatever must reproduce the service's work exactly (the
    naive baseline of the benchmarks).
    """

    def __init__(
        self,
        settings: TranslationConfig,
        encoder: PromptEncoder,
        model_fingerprint: str,
        languages: LanguageTable | None = None,
        prompt_format: PromptFormat | None = None,
        detector: LanguageDetector | None = None,
    ) -> None:
        self._settings = settings
        self._encoder = encoder
        self._detector = detector
        self._fingerprint = model_fingerprint
        self.languages = languages or LanguageTable()
        self._format = prompt_format or PromptFormat(FAMILIES[settings.family])
        self.decoding = settings.decoding
        self.options = self._format.family.options

    def languages_of(
        self, target_lang: str, source_lang: str | None
    ) -> tuple[Language, Language | None]:
        """``source_lang`` None or ``auto``: detect it per text."""
        target = self.languages.resolve(target_lang, field="target_lang")
        if not source_lang or source_lang.lower() == "auto":
            return target, None
        return target, self.languages.resolve(source_lang, field="source_lang")

    def detect(self, text: str) -> Detection:
        if self._detector is None:
            raise InvalidInput("language detection is not available")
        return self._detector.detect(text)

    def check(self, text: str, field: str) -> None:
        """The checks cheap enough for the event loop (before admission): not empty, not too
        long, valid Unicode."""
        if not text.strip():
            raise InvalidInput(f"{field}: the text is empty")
        if len(text) > self._settings.max_text_chars:
            raise TextTooLong(
                f"{field}: {len(text)} characters, at most {self._settings.max_text_chars}"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"{field}: the text is not valid Unicode (lone surrogate)") from None

    def prepare(
        self,
        text: str,
        target: Language,
        source: Language | None,
        *,
        field: str,
        options: TranslationOptions = PLAIN,
    ) -> Prepared:
        """The request for ``text``; ``field`` names it in errors (``texts[3]``)."""
        self.check(text, field)
        source_tokens = self._encoder.count_tokens(text)
        if source_tokens > self._settings.max_input_tokens:
            raise TextTooLong(
                f"{field}: {source_tokens} tokens, at most {self._settings.max_input_tokens}"
            )
        confidence = None
        if source is None and self._detector is not None:
            detection = self._detector.detect(text)
            source, confidence = detection.language, detection.confidence
        elif source is None and looks_chinese(text):
            source = self.languages["zh"]  # without a detector, at least pick the right template
        prompt = self._format.render(text, target, source, options)
        prompt_ids = self._encoder.encode_chat(prompt)
        if len(prompt_ids) > self._settings.max_prompt_tokens:
            raise self._too_long(field, len(prompt_ids), source_tokens, options, text)
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_new_tokens=token_budget(source_tokens, self._settings),
            decoding=self.decoding,
        )
        # The prompt carries every option's effect; the format also changes what is returned.
        key = (
            self._fingerprint,
            self._format.name,
            prompt,
            self.decoding,
            request.max_new_tokens,
            options.format,
        )
        restore = number_tags(text) if options.format == "markup" else None
        return Prepared(source, prompt, key, request, confidence, restore)

    def check_options(self, options: TranslationOptions) -> None:
        """The request's options within their bounds (cheap: before admission)."""
        check_options(options, self._settings.max_text_chars)

    def _too_long(
        self, field: str, tokens: int, text_tokens: int, options: TranslationOptions, text: str
    ) -> TextTooLong:
        """The error for a prompt over the limit, naming its largest part."""
        sizes = {"text": text_tokens} | {
            name: self._encoder.count_tokens(part)
            for name, part in option_parts(options, text).items()
        }
        largest = max(sizes, key=lambda name: sizes[name])
        parts = ", ".join(f"{name} {size}" for name, size in sizes.items())
        return TextTooLong(
            f"{largest}: the prompt for {field} would be {tokens} tokens, at most "
            f"{self._settings.max_prompt_tokens} ({parts}; the rest is the template)"
        )

    def chat_text(self, prepared: Prepared) -> str:
        """What the model reads for ``prepared``: the chat format's tokens written out."""
        return self._encoder.decode(prepared.request.prompt_ids)

    def prepare_chat(self, content: str, decoding: Decoding, max_new_tokens: int) -> Prepared:
        """The request for a user turn given as it is (no template of ours around it)."""
        field = "messages[0].content"
        self.check(content, field)
        tokens = self._encoder.count_tokens(content)
        if tokens > self._settings.max_input_tokens:
            raise TextTooLong(
                f"{field}: {tokens} tokens, at most {self._settings.max_input_tokens}"
            )
        request = GenerationRequest(
            prompt_ids=self._encoder.encode_chat(content),
            max_new_tokens=max_new_tokens,
            decoding=decoding,
        )
        key = (self._fingerprint, "chat", content, decoding, max_new_tokens)
        return Prepared(None, content, key, request)


class Translator:
    """Translates texts through the cache and the scheduler."""

    def __init__(
        self,
        settings: TranslationConfig,
        *,
        prompts: PromptBuilder,
        generator: Generator,
        admission: Admission,
        cache: ResultCache[GenerationResult],
        metrics: Metrics,
        preparer: TextPreparer,
    ) -> None:
        self._settings = settings
        self._prompts = prompts
        self._generator = generator
        self._admission = admission
        self._cache = cache
        self._metrics = metrics
        self._preparer = preparer
        self.languages = prompts.languages
        self.options = prompts.options  # what the family's templates support
        self.languages_of = prompts.languages_of
        self.max_batch_items = settings.max_batch_items
        self.max_new_tokens = settings.max_new_tokens
        self.decoding = prompts.decoding  # the model's recommended sampling

    async def translate(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        options: TranslationOptions = PLAIN,
    ) -> Translation:
        """``deadline`` is a ``time.monotonic()`` instant; past it, ``DeadlineExceeded``.
        A text longer than ``max_text_chars`` is translated as a document (``document``)."""
        if len(text) > self._settings.max_text_chars:
            return await self.document(
                text, target_lang, source_lang, deadline=deadline, options=options
            )
        target, source = self._prompts.languages_of(target_lang, source_lang)
        self._prompts.check(text, "text")
        self._prompts.check_options(options)
        if verbatim(text):
            return _as_is(text, source, target)
        with self._admission.reserve(1, deadline) as reservation:
            (prepared,) = await self._preparer.prepare([text], target, source, ["text"], options)
            translation = await self._run(prepared, target, deadline, reservation)
        if options.delimiter is not None:
            outcomes: list[Translation | ServiceError] = [translation]
            await self._keep_delimiters(
                [text], outcomes, options.delimiter, target_lang, source_lang, deadline
            )
            (outcome,) = outcomes
            if isinstance(outcome, ServiceError):
                raise outcome
            translation = outcome
        (checked,) = await self._check_targets([translation])
        return checked

    async def document(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        options: TranslationOptions = PLAIN,
        paced: bool = False,
    ) -> Translation:
        """A long text translated segment by segment (``segments.split_document``: its lines,
        long lines cut between sentences) as one batch, and joined back with its structure.
        ``paced`` (an uploaded file's text): the segments go in slices the queue has room
        for, each waiting while the queue is full, instead of being admitted all at once.
        The source language is detected once for the whole text; where the family has a
        context template and no other option is asked, each segment gets the one before it in
        its paragraph as context. Each segment is cached on its own. A failed segment fails
        the document."""
        self._prompts.check_options(options)
        split = await self._split(text, target_lang, source_lang)
        document, segments, todo = split.document, split.segments, split.todo
        target, source, confidence = split.target, split.source, split.confidence
        outcomes: list[Translation | BaseException] = []
        pace = self._pace() if paced else max(1, len(todo))
        for part in [todo[i : i + pace] for i in range(0, len(todo), pace)] or [todo]:

            async def attempt(part: list[int] = part) -> list[Translation | BaseException]:
                with self._admission.reserve(len(part), deadline) as reservation:
                    prepared = await self._prepare_segments(split, options, part)
                    return await asyncio.gather(
                        *(self._run(item, target, deadline, reservation) for item in prepared),
                        return_exceptions=True,
                    )

            outcomes += await (patiently(attempt, deadline) if paced else attempt())
        done: list[Translation] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            done.append(outcome)
        texts = list(segments)
        for index, translation in zip(todo, done, strict=True):
            texts[index] = translation.text
        whole = _combined(document.join(texts), done, source, target, confidence)
        (checked,) = await self._check_targets([whole])
        return checked

    async def _split(self, text: str, target_lang: str, source_lang: str | None) -> _Split:
        """A long text checked, cut into segments (in the worker pool) and its source language
        detected once for the whole text."""
        limit = self._settings.max_document_chars
        if len(text) > limit:
            raise TextTooLong(f"text: {len(text)} characters, at most {limit} for a document")
        target, source = self._prompts.languages_of(target_lang, source_lang)
        self._prompts.check(text[: self._settings.max_text_chars], "text")
        document = await self._preparer.split(
            text, min(_SEGMENT_CHARS, self._settings.max_text_chars)
        )
        segments = document.texts()
        confidence = None
        if source is None:
            (detection,) = await self._preparer.detect([text[:_DETECT_CHARS]])
            source, confidence = detection.language, detection.confidence
        todo = [index for index, segment in enumerate(segments) if not verbatim(segment)]
        return _Split(document, segments, todo, target, source, confidence)

    async def _prepare_segments(
        self, split: _Split, options: TranslationOptions, todo: Sequence[int]
    ) -> list[Prepared]:
        """The requests for the segments ``todo``: each with the segment before it in its
        paragraph as context where the family has a context template and no option is asked,
        else all with ``options`` in one call."""
        fields = [f"text (segment {i + 1})" for i in todo]
        if not ("context" in self.options and not options.asked()):
            texts = [split.segments[i] for i in todo]
            return await self._preparer.prepare(texts, split.target, split.source, fields, options)
        batches = await asyncio.gather(
            *(
                self._preparer.prepare(
                    [split.segments[i]],
                    split.target,
                    split.source,
                    [field],
                    self._chained(split.document, split.segments, i),
                )
                for i, field in zip(todo, fields, strict=True)
            )
        )
        return [item for batch in batches for item in batch]

    @staticmethod
    def _chained(document: Document, segments: list[str], index: int) -> TranslationOptions:
        """The context option for segment ``index``: the segment before it in its paragraph."""
        if index > 0 and document.paragraphs[index - 1] == document.paragraphs[index]:
            return TranslationOptions(context=segments[index - 1])
        return PLAIN

    async def prompt(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None = None,
        *,
        options: TranslationOptions = PLAIN,
    ) -> tuple[str, int]:
        """The exact text the model would read for this translation (chat format included) and
        its number of tokens, without generating: nothing is admitted or cached."""
        target, source = self._prompts.languages_of(target_lang, source_lang)
        self._prompts.check(text, "text")
        self._prompts.check_options(options)
        prepared, chat = await self._preparer.render(text, target, source, options)
        return chat, len(prepared.request.prompt_ids)

    async def translate_batch(
        self,
        texts: Sequence[str],
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        alternatives: int = 0,
        options: TranslationOptions = PLAIN,
    ) -> list[Translation | ServiceError]:
        """One result per text, in input order: its translation, or the error of that text alone.

        Invalid input fails the whole batch before any work starts (the error names the index);
        failures while generating (overload, deadline, out of memory) are reported per text.
        ``alternatives``: that many more translations of each text are sampled (admitted and
        scheduled as texts of their own) and the distinct ones kept.
        """
        if len(texts) > self._settings.max_batch_items:
            raise BatchTooLarge(
                f"texts: {len(texts)} texts, at most {self._settings.max_batch_items} per batch"
            )
        if not texts:
            return []
        target, source = self._prompts.languages_of(target_lang, source_lang)
        for index, text in enumerate(texts):
            self._prompts.check(text, f"texts[{index}]")
        self._prompts.check_options(options)
        # Every text answered as it is to begin with; those that are language replaced below.
        results: list[Translation | ServiceError] = [_as_is(text, source, target) for text in texts]
        todo = [index for index, text in enumerate(texts) if not verbatim(text)]
        if not todo:
            return results
        with self._admission.reserve(len(todo) * (1 + alternatives), deadline) as reservation:
            fields = [f"texts[{index}]" for index in todo]
            prepared = await self._preparer.prepare(
                [texts[index] for index in todo], target, source, fields, options
            )
            outcomes = await asyncio.gather(
                *(
                    self._run(item, target, deadline, reservation, alternatives)
                    for item in prepared
                ),
                return_exceptions=True,
            )
        for index, outcome in zip(todo, outcomes, strict=True):
            if isinstance(outcome, Translation | ServiceError):
                results[index] = outcome
            else:
                raise outcome  # a bug, not a per-text failure: the one 500 path
        if options.delimiter is not None:
            await self._keep_delimiters(
                texts, results, options.delimiter, target_lang, source_lang, deadline
            )
        done = {i: r for i in todo if isinstance(r := results[i], Translation)}
        checked = await self._check_targets(list(done.values()))
        for index, translation in zip(done, checked, strict=True):
            results[index] = translation
        return results

    async def _check_targets(self, translations: list[Translation]) -> list[Translation]:
        """The translations, flagged where one is surely in another language than its target
        (detected in the worker pool, counted by target)."""
        # Too short to judge (``target_mismatch`` says no): not sent to the detector at all.
        judged = [i for i, t in enumerate(translations) if letters(t.text) >= MISMATCH_LETTERS]
        if not judged:
            return translations
        detections = await self._preparer.detect([translations[i].text for i in judged])
        checked = list(translations)
        for index, detection in zip(judged, detections, strict=True):
            translation = translations[index]
            if target_mismatch(translation.text, translation.target, detection):
                self._metrics.target_mismatches.labels(target=translation.target.code).inc()
                checked[index] = dataclasses.replace(translation, target_mismatch=True)
        return checked

    async def translate_markup(
        self,
        documents: Sequence[str],
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        ignore: Sequence[str] = (),
        inline: Iterable[str] = (),
        paced: bool = False,
    ) -> list[Translation | ServiceError]:
        """Translate HTML or XML documents: tags kept, the text between them translated, the
        contents of the ``ignore`` elements and of those marked ``translate="no"`` kept. A run
        through ``inline`` elements is translated whole, tags included; where its translation
        does not keep those tags in order, its pieces between the tags are translated instead.
        ``paced``: the runs go in slices the queue has room for (as ``document``'s)."""
        target, _ = self._prompts.languages_of(target_lang, source_lang)
        segmented = [segment(document, ignore, inline) for document in documents]
        runs = [s.parts[i] for s in segmented for i in s.texts]
        outcomes = await self._in_batches(runs, target_lang, source_lang, deadline, paced)
        await self._untangle(segmented, outcomes, target_lang, source_lang, deadline, paced)
        results: list[Translation | ServiceError] = []
        position = 0
        for document in segmented:
            mine = outcomes[position : position + len(document.texts)]
            position += len(document.texts)
            failure = next((o for o in mine if isinstance(o, ServiceError)), None)
            if failure is not None:
                results.append(failure)
                continue
            done = [o for o in mine if isinstance(o, Translation)]
            first = done[0] if done else None
            results.append(
                _combined(
                    document.rebuild([t.text for t in done]),
                    done,
                    first.source if first else None,
                    target,
                    first.detected_confidence if first else None,
                )
            )
        return results

    async def _untangle(
        self,
        segmented: list[Segmented],
        outcomes: list[Translation | ServiceError],
        target_lang: str,
        source_lang: str | None,
        deadline: float | None,
        paced: bool = False,
    ) -> None:
        """Where a run translated whole lost or reordered its inline tags, translate its pieces
        between the tags instead and put them back around the original tags (in place)."""
        redo: list[tuple[int, Segmented]] = []
        position = 0
        for document in segmented:
            for index in document.texts:
                outcome = outcomes[position]
                split = document.pieces.get(index)
                if (
                    split is not None
                    and isinstance(outcome, Translation)
                    and tag_sequence(outcome.text) != tag_sequence(document.parts[index])
                ):
                    redo.append((position, split))
                position += 1
        if not redo:
            return
        pieces = [split.parts[i] for _, split in redo for i in split.texts]
        again = await self._in_batches(pieces, target_lang, source_lang, deadline, paced)
        start = 0
        for position, split in redo:
            mine = again[start : start + len(split.texts)]
            start += len(split.texts)
            failure = next((o for o in mine if isinstance(o, ServiceError)), None)
            whole = outcomes[position]
            assert isinstance(whole, Translation)
            if failure is not None:
                outcomes[position] = failure
                continue
            done = [o for o in mine if isinstance(o, Translation)]
            outcomes[position] = dataclasses.replace(
                whole,
                text=split.rebuild([t.text for t in done]).strip(),
                input_tokens=whole.input_tokens + sum(t.input_tokens for t in done),
                output_tokens=whole.output_tokens + sum(t.output_tokens for t in done),
            )

    async def _in_batches(
        self,
        texts: Sequence[str],
        target_lang: str,
        source_lang: str | None,
        deadline: float | None,
        paced: bool = False,
    ) -> list[Translation | ServiceError]:
        """``translate_batch`` for any number of texts (a document's runs): batches of the
        largest size, all admitted at once; ``paced``, slices the queue has room for, one after
        the other, each waiting while the queue is full."""
        size = self._settings.max_batch_items
        long = {i for i, text in enumerate(texts) if len(text) > self._settings.max_text_chars}
        if long:  # a run longer than a text may be (a long paragraph): cut at its sentences
            short = iter(
                await self._in_batches(
                    [t for i, t in enumerate(texts) if i not in long],
                    target_lang,
                    source_lang,
                    deadline,
                    paced,
                )
            )
            merged: list[Translation | ServiceError] = []
            for index, text in enumerate(texts):
                if index not in long:
                    merged.append(next(short))
                    continue
                try:
                    merged.append(
                        await self.document(
                            text, target_lang, source_lang, deadline=deadline, paced=paced
                        )
                    )
                except ServiceError as error:
                    merged.append(error)
            return merged
        if paced:
            pace = self._pace()
            paced_outcomes: list[Translation | ServiceError] = []
            for start in range(0, len(texts), pace):
                part = texts[start : start + pace]

                async def attempt(
                    part: Sequence[str] = part,
                ) -> list[Translation | ServiceError]:
                    return await self._in_batches(part, target_lang, source_lang, deadline)

                paced_outcomes += await patiently(attempt, deadline)
            return paced_outcomes
        if len(texts) <= size:
            return await self.translate_batch(texts, target_lang, source_lang, deadline=deadline)
        batches = await asyncio.gather(
            *(
                self.translate_batch(
                    texts[start : start + size], target_lang, source_lang, deadline=deadline
                )
                for start in range(0, len(texts), size)
            )
        )
        return [outcome for batch in batches for outcome in batch]

    def _pace(self) -> int:
        """Texts of one uploaded document in flight at once: a quarter of what this process
        admits, so live requests and a second document still find room."""
        return max(1, self._admission.limit // _PACE_SHARE)

    async def _keep_delimiters(
        self,
        texts: Sequence[str],
        outcomes: list[Translation | ServiceError],
        delimiter: str,
        target_lang: str,
        source_lang: str | None,
        deadline: float | None,
    ) -> None:
        """Where a translation asked to keep ``delimiter`` came back with another count of it,
        translate the pieces between the delimiters one by one and join them with it (in
        place): the caller splits on the delimiter, so a wrong count is never passed on."""
        redo = [
            (index, text.split(delimiter))
            for index, (text, outcome) in enumerate(zip(texts, outcomes, strict=True))
            if isinstance(outcome, Translation)
            and outcome.text.count(delimiter) != text.count(delimiter)
        ]
        if not redo:
            return
        # Only the pieces with words are translated; the whitespace around each is kept.
        cores = [
            (index, number, piece.strip())
            for index, pieces in redo
            for number, piece in enumerate(pieces)
            if piece.strip()
        ]
        again = await self._in_batches(
            [core for _, _, core in cores], target_lang, source_lang, deadline
        )
        translated: dict[tuple[int, int], Translation | ServiceError] = {
            (index, number): outcome
            for (index, number, _), outcome in zip(cores, again, strict=True)
        }
        for index, pieces in redo:
            mine = [translated[(index, n)] for n in range(len(pieces)) if (index, n) in translated]
            failure = next((o for o in mine if isinstance(o, ServiceError)), None)
            whole = outcomes[index]
            assert isinstance(whole, Translation)
            if failure is not None:
                outcomes[index] = failure
                continue
            joined = []
            for number, piece in enumerate(pieces):
                done = translated.get((index, number))
                if not isinstance(done, Translation):
                    joined.append(piece)
                    continue
                core = piece.strip()
                start = piece.index(core)
                joined.append(piece[:start] + done.text + piece[start + len(core) :])
            parts = [o for o in mine if isinstance(o, Translation)]
            outcomes[index] = dataclasses.replace(
                whole,
                text=delimiter.join(joined),
                input_tokens=whole.input_tokens + sum(t.input_tokens for t in parts),
                output_tokens=whole.output_tokens + sum(t.output_tokens for t in parts),
            )

    async def detect(self, texts: Sequence[str]) -> list[Detection]:
        """The detected language of each text (no model work; in the worker pool)."""
        return await self._preparer.detect(texts)

    async def warm_up(self) -> None:
        """One generation per prompt template, bypassing cache and admission, before serving."""
        english = self.languages["en"]
        for target in (self.languages["de"], self.languages["zh"]):
            (prepared,) = await self._preparer.prepare(["Hello."], target, english, ["warm-up"])
            await self._generator.generate(prepared.request)

    async def complete(
        self,
        content: str,
        *,
        decoding: Decoding,
        max_new_tokens: int,
        deadline: float | None = None,
    ) -> Completion:
        """Generate the answer to one user turn given as it is, through the same admission,
        cache and scheduler as a translation."""
        self._prompts.check(content, "messages[0].content")
        with self._admission.reserve(1, deadline) as reservation:
            prepared = await self._preparer.prepare_chat(content, decoding, max_new_tokens)
            result, origin, queue_s, inference_s = await self._generate(
                prepared, deadline, reservation
            )
        return Completion(
            text=result.text,
            input_tokens=result.prompt_tokens,
            output_tokens=result.completion_tokens,
            finish_reason=result.finish_reason,
            cache=origin,
            queue_s=queue_s,
            inference_s=inference_s,
        )

    async def stream(
        self,
        content: str,
        *,
        decoding: Decoding,
        max_new_tokens: int,
        deadline: float | None = None,
    ) -> AsyncIterator[str | Completion]:
        """The answer to one user turn as it is generated: pieces of text (each what follows
        the ones before), then the ``Completion`` with the whole text. Admitted and scheduled
        as ``complete`` is, but never cached or shared: each stream is its own generation. An
        engine that cannot stream gives the text as one piece at the end."""
        self._prompts.check(content, "messages[0].content")
        with self._admission.reserve(1, deadline) as reservation:
            prepared = await self._preparer.prepare_chat(content, decoding, max_new_tokens)
            async for item in self._streamed(prepared, deadline, reservation):
                if isinstance(item, str):
                    yield item
                    continue
                result = item.result
                yield Completion(
                    text=result.text,
                    input_tokens=result.prompt_tokens,
                    output_tokens=result.completion_tokens,
                    finish_reason=result.finish_reason,
                    cache="bypass",
                    queue_s=item.queue_s,
                    inference_s=item.inference_s,
                )

    async def stream_translation(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None = None,
        *,
        deadline: float | None = None,
        options: TranslationOptions = PLAIN,
    ) -> AsyncIterator[str | Translation]:
        """One translation as it is generated: pieces of text, then the ``Translation`` (whole
        text, usage, target check). Admitted as ``translate`` is; never cached or shared. Markup
        sent with numbered tags comes in one piece once its tags are restored."""
        self._prompts.check_options(options)
        if len(text) > self._settings.max_text_chars:
            async for part in self._stream_document(
                text, target_lang, source_lang, deadline=deadline, options=options
            ):
                yield part
            return
        if options.delimiter is not None:
            # Sent once its delimiters are checked (and the pieces redone where they were lost).
            done = await self.translate(
                text, target_lang, source_lang, deadline=deadline, options=options
            )
            yield done.text
            yield done
            return
        target, source = self._prompts.languages_of(target_lang, source_lang)
        self._prompts.check(text, "text")
        if verbatim(text):
            yield text
            yield _as_is(text, source, target)
            return
        with self._admission.reserve(1, deadline) as reservation:
            (prepared,) = await self._preparer.prepare([text], target, source, ["text"], options)
            restore = prepared.restore
            thoughts = ThoughtFilter() if self._settings.think_tags else None
            async for item in self._streamed(prepared, deadline, reservation):
                if isinstance(item, str):
                    piece = item if thoughts is None else thoughts.feed(item)
                    if restore is None and piece:
                        yield piece
                    continue
                result = item.result
                whole = self._answer(prepared, result.text)
                if restore is not None:
                    yield whole
                elif thoughts is not None and (held := thoughts.rest()):
                    yield held
                translation = Translation(
                    text=whole,
                    source=prepared.source,
                    target=target,
                    detected_confidence=prepared.detected_confidence,
                    input_tokens=result.prompt_tokens,
                    output_tokens=result.completion_tokens,
                    cache="bypass",
                    queue_s=item.queue_s,
                    inference_s=item.inference_s,
                )
        (checked,) = await self._check_targets([translation])
        yield checked

    async def _stream_document(
        self,
        text: str,
        target_lang: str,
        source_lang: str | None,
        *,
        deadline: float | None,
        options: TranslationOptions,
    ) -> AsyncIterator[str | Translation]:
        """A long text streamed: its segments are generated at once, as in ``document``, and
        the text goes out in document order, each segment's pieces as they are generated (the
        glue between segments as it is). Never cached; leaving early cancels every segment."""
        split = await self._split(text, target_lang, source_lang)
        document, segments, todo = split.document, split.segments, split.todo
        target, source, confidence = split.target, split.source, split.confidence
        streams: dict[int, asyncio.Queue[str | Scheduled | BaseException]] = {}
        tasks: list[asyncio.Task[None]] = []

        async def pump(
            prepared: Prepared, out: asyncio.Queue[str | Scheduled | BaseException]
        ) -> None:
            try:
                async for item in self._streamed(prepared, deadline, reservation):
                    out.put_nowait(item)
            except Exception as error:  # handed to the reader, in document order
                out.put_nowait(error)

        with self._admission.reserve(len(todo), deadline) as reservation:
            prepared_all = await self._prepare_segments(split, options, todo)
            for index, prepared in zip(todo, prepared_all, strict=True):
                streams[index] = asyncio.Queue()
                tasks.append(asyncio.ensure_future(pump(prepared, streams[index])))
            try:
                done: list[Translation] = []
                texts = list(segments)
                position = {part: n for n, part in enumerate(document.sentences)}
                by_segment = dict(zip(todo, prepared_all, strict=True))
                for part_index, part in enumerate(document.parts):
                    segment = position.get(part_index)
                    if segment is None or segment not in streams:
                        yield part
                        continue
                    prepared = by_segment[segment]
                    thoughts = ThoughtFilter() if self._settings.think_tags else None
                    streamed = ""
                    while True:
                        got = await streams[segment].get()
                        if isinstance(got, BaseException):
                            raise got
                        if isinstance(got, str):
                            piece = got if thoughts is None else thoughts.feed(got)
                            if piece and prepared.restore is None:
                                streamed += piece
                                yield piece
                            continue
                        answer = self._answer(prepared, got.result.text)
                        if answer.startswith(streamed) and len(answer) > len(streamed):
                            yield answer[len(streamed) :]
                        texts[segment] = answer
                        done.append(
                            Translation(
                                text=answer,
                                source=source,
                                target=target,
                                detected_confidence=confidence,
                                input_tokens=got.result.prompt_tokens,
                                output_tokens=got.result.completion_tokens,
                                cache="bypass",
                                queue_s=got.queue_s,
                                inference_s=got.inference_s,
                            )
                        )
                        break
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        whole = _combined(document.join(texts), done, source, target, confidence)
        (checked,) = await self._check_targets([whole])
        yield checked

    async def _streamed(
        self, prepared: Prepared, deadline: float | None, reservation: Reservation
    ) -> AsyncIterator[str | Scheduled]:
        """``prepared`` generated with its text streamed: the pieces as the engine sends them,
        the rest of the final text (what the last pieces held back), then the result. Leaving
        early cancels the generation in the engine."""
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        async def generate() -> Scheduled:
            try:
                with _released(reservation):
                    return await self._generator.generate(
                        prepared.request, deadline, pieces.put_nowait
                    )
            finally:
                pieces.put_nowait(None)

        task = asyncio.ensure_future(generate())
        try:
            streamed = ""
            while (piece := await pieces.get()) is not None:
                streamed += piece
                yield piece
            scheduled = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        text = scheduled.result.text
        if text.startswith(streamed) and len(text) > len(streamed):
            yield text[len(streamed) :]
        yield scheduled

    async def _run(
        self,
        prepared: Prepared,
        target: Language,
        deadline: float | None,
        reservation: Reservation,
        alternatives: int = 0,
    ) -> Translation:
        if alternatives:
            # Every generation runs to its end (each gives its admitted slot back itself).
            outcomes = await asyncio.gather(
                self._generate(prepared, deadline, reservation),
                *(
                    self._generate(self._alternative(prepared, index), deadline, reservation)
                    for index in range(alternatives)
                ),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            main, *others = (
                outcome for outcome in outcomes if not isinstance(outcome, BaseException)
            )
        else:
            main, others = await self._generate(prepared, deadline, reservation), []
        result, origin, queue_s, inference_s = main
        text = self._answer(prepared, result.text)
        distinct = dict.fromkeys(
            draft
            for draft in (self._answer(prepared, other[0].text) for other in others)
            if draft != text
        )
        return Translation(
            text=text,
            source=prepared.source,
            target=target,
            detected_confidence=prepared.detected_confidence,
            input_tokens=result.prompt_tokens,
            output_tokens=result.completion_tokens,
            cache=origin,
            queue_s=queue_s,
            inference_s=inference_s,
            alternatives=tuple(distinct),
        )

    def _answer(self, prepared: Prepared, text: str) -> str:
        """The translation in the model's answer: without a think block, tags restored."""
        if self._settings.think_tags:
            text = without_thoughts(text)
        return prepared.restore.restore(text) if prepared.restore is not None else text

    def _alternative(self, prepared: Prepared, index: int) -> Prepared:
        """Another draw for ``prepared``: sampled (the model card's sampling where the service
        decodes greedily) and cached apart from the translation and the other draws."""
        decoding = MODEL_CARD_DECODING if self.decoding.greedy else self.decoding
        return dataclasses.replace(
            prepared,
            key=(*prepared.key, "alternative", index, decoding),
            request=dataclasses.replace(prepared.request, decoding=decoding),
        )

    async def _generate(
        self, prepared: Prepared, deadline: float | None, reservation: Reservation
    ) -> tuple[GenerationResult, str, float, float]:
        """The result for ``prepared`` (cached, shared or generated), where it came from, and
        its time queued and generating."""
        timings: list[tuple[float, float]] = []

        async def generate() -> GenerationResult:
            # A generation shared by identical requests runs under the first one's deadline.
            scheduled = await self._generator.generate(prepared.request, deadline)
            timings.append((scheduled.queue_s, scheduled.inference_s))
            return scheduled.result

        # The dispatcher enforces the deadline (and counts it); a request that joined an
        # identical generation in flight waits under that generation's deadline.
        with _released(reservation):
            result, origin = await self._cache.get_or_create(prepared.key, generate)
        if self._settings.log_texts:
            # Opt-in only: texts are user data and stay out of logs by default.
            log.info("translated", extra={"prompt": prepared.prompt, "translation": result.text})
        if origin == "hit":
            self._metrics.cache_hits.inc()
        else:
            self._metrics.cache_misses.inc()
            if origin == "shared":
                self._metrics.cache_shared.inc()
        self._metrics.cache_entries.set(len(self._cache))
        queue_s, inference_s = timings[0] if timings else (0.0, 0.0)
        return result, origin, queue_s, inference_s


@contextlib.contextmanager
def _released(reservation: Reservation) -> Iterator[None]:
    """Give back one admitted slot when one text is answered, however it ends; a cancelled text
    is left to the reservation, which counts it as cancelled."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except BaseException:
        reservation.release(1)
        raise
    reservation.release(1)


@dataclass(frozen=True, slots=True)
class _Split:
    """A long text as segments, with its languages (``Translator._split``)."""

    document: Document
    segments: list[str]
    # Indexes of the segments to translate (the others are not language).
    todo: list[int]
    target: Language
    source: Language | None
    confidence: float | None


def _combined(
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


def _as_is(text: str, source: Language | None, target: Language) -> Translation:
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
