"""Translations and chat answers as they are generated: pieces of text, then the whole result;
long texts stream segment by segment in document order. Never cached or shared."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from service.contract.errors import TooManyTokens
from service.contract.types import (
    Decoding,
    Scheduled,
)
from service.frontend.translation.core import TranslationCore
from service.frontend.translation.long_texts import LongTexts
from service.frontend.translation.prompts import (
    PLAIN,
    TranslationOptions,
)
from service.frontend.translation.results import (
    Completion,
    Prepared,
    TranslateOne,
    Translation,
    as_is,
    combined,
)
from service.frontend.translation.thinking import ThoughtFilter
from service.frontend.translation.verbatim import verbatim


class Streams:
    """Streamed flows over the core; ``translate`` answers a text whose delimiters must be
    checked before any of it is sent."""

    def __init__(
        self, core: TranslationCore, long_texts: LongTexts, translate: TranslateOne
    ) -> None:
        self._core = core
        self._long = long_texts
        self._translate = translate

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
        self._core.prompts.check(content, "messages[0].content")
        with self._core.admission.reserve(1, deadline) as reservation:
            prepared = await self._core.preparer.prepare_chat(content, decoding, max_new_tokens)
            async for item in self._core.streamed(prepared, deadline, reservation):
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
                    cached_tokens=result.cached_tokens,
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
        self._core.prompts.check_options(options)
        if len(text) > self._core.settings.max_text_chars:
            async for part in self._stream_document(
                text, target_lang, source_lang, deadline=deadline, options=options
            ):
                yield part
            return
        if options.delimiter is not None:
            # Sent once its delimiters are checked (and the pieces redone where they were lost).
            done = await self._translate(
                text, target_lang, source_lang, deadline=deadline, options=options
            )
            yield done.text
            yield done
            return
        target, source = self._core.prompts.languages_of(target_lang, source_lang)
        self._core.prompts.check(text, "text")
        if verbatim(text):
            yield text
            yield as_is(text, source, target)
            return
        with self._core.admission.reserve(1, deadline) as reservation:
            try:
                (prepared,) = await self._core.preparer.prepare(
                    [text], target, source, ["text"], options
                )
            except TooManyTokens:
                prepared = None  # more tokens than a text may have: as a document, below
            if prepared is not None:
                restore = prepared.restore
                thoughts = ThoughtFilter() if self._core.settings.think_tags else None
                async for item in self._core.streamed(prepared, deadline, reservation):
                    if isinstance(item, str):
                        piece = item if thoughts is None else thoughts.feed(item)
                        if restore is None and piece:
                            yield piece
                        continue
                    result = item.result
                    whole = self._core.answer(prepared, result.text)
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
        if prepared is None:
            async for part in self._stream_document(
                text, target_lang, source_lang, deadline=deadline, options=options
            ):
                yield part
            return
        (checked,) = await self._core.check_targets([translation])
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
        split = await self._long.split(text, target_lang, source_lang)
        document, segments, todo = split.document, split.segments, split.todo
        target, source, confidence = split.target, split.source, split.confidence
        streams: dict[int, asyncio.Queue[str | Scheduled | BaseException]] = {}
        tasks: list[asyncio.Task[None]] = []

        async def pump(
            prepared: Prepared, out: asyncio.Queue[str | Scheduled | BaseException]
        ) -> None:
            try:
                async for item in self._core.streamed(prepared, deadline, reservation):
                    out.put_nowait(item)
            except Exception as error:  # handed to the reader, in document order
                out.put_nowait(error)

        with self._core.admission.reserve(len(todo), deadline, segments=True) as reservation:
            prepared_all = await self._long.prepare_segments(split, options, todo)
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
                    thoughts = ThoughtFilter() if self._core.settings.think_tags else None
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
                        answer = self._core.answer(prepared, got.result.text)
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
        whole = combined(document.join(texts), done, source, target, confidence)
        (checked,) = await self._core.check_targets([whole])
        yield checked
