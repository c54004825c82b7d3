"""Texts longer than one segment: cut at their lines and sentences, translated segment by segment
(each with the one before it as context where the family has a context template), and joined
back with their structure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from service.contract.errors import TextTooLong
from service.frontend.policy.admission import patiently
from service.frontend.translation.core import TranslationCore
from service.frontend.translation.languages import Language
from service.frontend.translation.prompts import (
    PLAIN,
    TranslationOptions,
)
from service.frontend.translation.results import (
    Prepared,
    Translation,
    combined,
)
from service.frontend.translation.segments import Document
from service.frontend.translation.verbatim import verbatim

# The longest segment of a document (a line, or a run of a long line's sentences).
_SEGMENT_CHARS = 1000
# The start of a document its source language is detected from.
_DETECT_CHARS = 4000


@dataclass(frozen=True, slots=True)
class Split:
    """A long text as segments, with its languages (``LongTexts.split``)."""

    document: Document
    segments: list[str]
    # Indexes of the segments to translate (the others are not language).
    todo: list[int]
    target: Language
    source: Language | None
    confidence: float | None


class LongTexts:
    """Documents: a long text as one translation of its segments."""

    def __init__(self, core: TranslationCore) -> None:
        self._core = core

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
        self._core.prompts.check_options(options)
        split = await self.split(text, target_lang, source_lang)
        document, segments, todo = split.document, split.segments, split.todo
        target, source, confidence = split.target, split.source, split.confidence
        outcomes: list[Translation | BaseException] = []
        pace = self._core.pace() if paced else max(1, len(todo))
        for part in [todo[i : i + pace] for i in range(0, len(todo), pace)] or [todo]:

            async def attempt(part: list[int] = part) -> list[Translation | BaseException]:
                with self._core.admission.reserve(
                    len(part), deadline, segments=True
                ) as reservation:
                    prepared = await self.prepare_segments(split, options, part)
                    return await asyncio.gather(
                        *(self._core.run(item, target, deadline, reservation) for item in prepared),
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
        whole = combined(document.join(texts), done, source, target, confidence)
        (checked,) = await self._core.check_targets([whole])
        return checked

    def check(self, text: str, field: str) -> None:
        """A long text within a document's characters, its start valid (cheap: before
        admission)."""
        limit = self._core.settings.max_document_chars
        if len(text) > limit:
            raise TextTooLong(f"{field}: {len(text)} characters, at most {limit} for a document")
        # Its first characters after any leading space: a text that opens with a page of blank
        # lines is not empty.
        start = text.lstrip() or text
        self._core.prompts.check(start[: self._core.settings.max_text_chars], field)

    async def split(self, text: str, target_lang: str, source_lang: str | None) -> Split:
        """A long text checked, cut into segments (in the worker pool) and its source language
        detected once for the whole text."""
        self.check(text, "text")
        target, source = self._core.prompts.languages_of(target_lang, source_lang)
        most = self._core.settings.max_text_chars
        document = await self._core.preparer.split(text, min(_SEGMENT_CHARS, most), most)
        segments = document.texts()
        confidence = None
        if source is None:
            (detection,) = await self._core.preparer.detect([text[:_DETECT_CHARS]])
            source, confidence = detection.language, detection.confidence
        todo = [index for index, segment in enumerate(segments) if not verbatim(segment)]
        return Split(document, segments, todo, target, source, confidence)

    async def prepare_segments(
        self, split: Split, options: TranslationOptions, todo: Sequence[int]
    ) -> list[Prepared]:
        """The requests for the segments ``todo``: each with the segment before it in its
        paragraph as context where the family has a context template and no option is asked,
        else all with ``options`` in one call."""
        fields = [f"text (segment {i + 1})" for i in todo]
        if not ("context" in self._core.options and not options.asked()):
            texts = [split.segments[i] for i in todo]
            return await self._core.preparer.prepare(
                texts, split.target, split.source, fields, options
            )
        batches = await asyncio.gather(
            *(
                self._core.preparer.prepare(
                    [split.segments[i]],
                    split.target,
                    split.source,
                    [field],
                    self.chained(split.document, split.segments, i),
                )
                for i, field in zip(todo, fields, strict=True)
            )
        )
        return [item for batch in batches for item in batch]

    @staticmethod
    def chained(document: Document, segments: list[str], index: int) -> TranslationOptions:
        """The context option for segment ``index``: the segment before it in its paragraph."""
        if index > 0 and document.paragraphs[index - 1] == document.paragraphs[index]:
            return TranslationOptions(context=segments[index - 1])
        return PLAIN
