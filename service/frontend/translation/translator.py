"""``Translator``: what every API dialect calls, knowing nothing of HTTP.

A request is admitted first (O(1), ``policy.admission``), before any per-text work; then its
texts are validated, language-detected and tokenized in a worker pool, never on the event loop
that answers ``/health`` and refusals. Batches are validated whole before any generation starts
(an error names the offending index), then cached and generated item by item. The core steps
live in ``core.py``; the flows that grew on them in their own modules: long texts
(``long_texts.py``), markup (``markup_texts.py``), delimiters (``delimiters.py``) and
streaming (``streaming.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from service.contract.errors import BatchTooLarge, ServiceError, TooManyTokens
from service.contract.types import (
    Decoding,
)
from service.frontend.policy.admission import patiently
from service.frontend.translation.core import TranslationCore
from service.frontend.translation.delimiters import keep_delimiters
from service.frontend.translation.detection import (
    Detection,
)
from service.frontend.translation.languages import Language
from service.frontend.translation.long_texts import LongTexts
from service.frontend.translation.markup_texts import MarkupTexts
from service.frontend.translation.prompts import (
    PLAIN,
    TranslationOptions,
)
from service.frontend.translation.results import (
    Completion,
    Prepared,
    Translation,
    as_is,
)
from service.frontend.translation.streaming import Streams
from service.frontend.translation.verbatim import verbatim


class Translator:
    """Translates texts through the cache and the engine; the facade of the flows."""

    def __init__(self, core: TranslationCore) -> None:
        self._core = core
        settings, prompts = core.settings, core.prompts
        self._prompts = prompts
        self._long = LongTexts(core)
        self._markup = MarkupTexts(core, self._in_batches)
        self._streams = Streams(core, self._long, self.translate)
        self.languages = prompts.languages
        self.options = prompts.options  # what the family's templates support
        self.languages_of = prompts.languages_of
        self.max_batch_items = settings.max_batch_items
        self.max_new_tokens = settings.max_new_tokens
        self.decoding = prompts.decoding  # the model's recommended sampling
        # The flows of their own modules, as the dialects call them.
        self.document = self._long.document
        self.translate_markup = self._markup.translate_markup
        self.stream = self._streams.stream
        self.stream_translation = self._streams.stream_translation

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
        A text longer than ``max_text_chars``, or of more tokens than a text may have, is
        translated as a document (``document``: cut into segments)."""
        if len(text) > self._core.settings.max_text_chars:
            return await self._long.document(
                text, target_lang, source_lang, deadline=deadline, options=options
            )
        target, source = self._core.prompts.languages_of(target_lang, source_lang)
        self._core.prompts.check(text, "text")
        self._core.prompts.check_options(options)
        if verbatim(text):
            return as_is(text, source, target)
        try:
            with self._core.admission.reserve(1, deadline) as reservation:
                (prepared,) = await self._core.preparer.prepare(
                    [text], target, source, ["text"], options
                )
                translation = await self._core.run(prepared, target, deadline, reservation)
        except TooManyTokens:
            return await self._long.document(
                text, target_lang, source_lang, deadline=deadline, options=options
            )
        if options.delimiter is not None:
            outcomes: list[Translation | ServiceError] = [translation]
            await keep_delimiters(
                self._in_batches,
                [text],
                outcomes,
                options.delimiter,
                target_lang,
                source_lang,
                deadline,
            )
            (outcome,) = outcomes
            if isinstance(outcome, ServiceError):
                raise outcome
            translation = outcome
        (checked,) = await self._core.check_targets([translation])
        return checked

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
        target, source = self._core.prompts.languages_of(target_lang, source_lang)
        self._core.prompts.check(text, "text")
        self._core.prompts.check_options(options)
        prepared, chat = await self._core.preparer.render(text, target, source, options)
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
        A text over ``max_text_chars`` or the tokens a text may have (up to a document's
        characters) is translated as a document, cut into segments, as ``/translate`` does.
        ``alternatives``: that many more translations of each text are sampled (admitted and
        scheduled as texts of their own) and the distinct ones kept (not for a document).
        """
        most = self.max_batch_items
        if len(texts) > most:
            raise BatchTooLarge(f"texts: {len(texts)} texts, at most {most} per batch")
        if not texts:
            return []
        target, source = self._core.prompts.languages_of(target_lang, source_lang)
        longest = self._core.settings.max_text_chars
        for index, text in enumerate(texts):
            if len(text) > longest:
                self._long.check(text, f"texts[{index}]")
            else:
                self._core.prompts.check(text, f"texts[{index}]")
        self._core.prompts.check_options(options)
        # Every text answered as it is to begin with; those that are language replaced below.
        results: list[Translation | ServiceError] = [as_is(text, source, target) for text in texts]
        todo = [index for index, text in enumerate(texts) if not verbatim(text)]
        if not todo:
            return results
        documents = [index for index in todo if len(texts[index]) > longest]
        short = [index for index in todo if len(texts[index]) <= longest]
        # The short texts' places (a document is admitted segment by segment, by itself).
        admitted = len(short) * (1 + alternatives)
        with self._core.admission.reserve(admitted, deadline) as held:
            # Every text prepared (and checked) before any generation starts.
            prepared, dense = await self._prepared(texts, short, target, source, options)
            held.release(len(dense) * (1 + alternatives))  # each a document of its own
            documents = sorted(documents + dense)
            outcomes, whole = await asyncio.gather(
                asyncio.gather(
                    *(
                        self._core.run(item, target, deadline, held, alternatives)
                        for _, item in prepared
                    ),
                    return_exceptions=True,
                ),
                asyncio.gather(
                    *(
                        self._long.document(
                            texts[index],
                            target_lang,
                            source_lang,
                            deadline=deadline,
                            options=options,
                        )
                        for index in documents
                    ),
                    return_exceptions=True,
                ),
            )
        done = [index for index, _ in prepared] + documents
        for index, outcome in zip(done, [*outcomes, *whole], strict=True):
            if not isinstance(outcome, Translation | ServiceError):
                raise outcome  # a bug, not a per-text failure: the one 500 path
            results[index] = outcome
        return await self._finished(
            texts, todo, results, target_lang, source_lang, deadline, options
        )

    async def _prepared(
        self,
        texts: Sequence[str],
        todo: list[int],
        target: Language,
        source: Language | None,
        options: TranslationOptions,
    ) -> tuple[list[tuple[int, Prepared]], list[int]]:
        """The requests for ``texts[todo]`` by index, and the indexes of those of too many
        tokens (prepared again one by one to find them: a document each instead)."""
        if not todo:
            return [], []
        fields = [f"texts[{index}]" for index in todo]
        try:
            prepared = await self._core.preparer.prepare(
                [texts[index] for index in todo], target, source, fields, options
            )
            return list(zip(todo, prepared, strict=True)), []
        except TooManyTokens:
            pass
        alone = await asyncio.gather(
            *(
                self._core.preparer.prepare([texts[index]], target, source, [field], options)
                for index, field in zip(todo, fields, strict=True)
            ),
            return_exceptions=True,
        )
        for outcome in alone:
            if isinstance(outcome, BaseException) and not isinstance(outcome, TooManyTokens):
                raise outcome  # the first invalid text in order, as the batch's error
        found = [
            (index, outcome[0])
            for index, outcome in zip(todo, alone, strict=True)
            if not isinstance(outcome, BaseException)
        ]
        dense = [
            index
            for index, outcome in zip(todo, alone, strict=True)
            if isinstance(outcome, TooManyTokens)
        ]
        return found, dense

    async def _finished(
        self,
        texts: Sequence[str],
        todo: list[int],
        results: list[Translation | ServiceError],
        target_lang: str,
        source_lang: str | None,
        deadline: float | None,
        options: TranslationOptions,
    ) -> list[Translation | ServiceError]:
        """``results`` with the batch's delimiters kept and its targets checked."""
        if options.delimiter is not None:
            await keep_delimiters(
                self._in_batches,
                texts,
                results,
                options.delimiter,
                target_lang,
                source_lang,
                deadline,
            )
        done = {i: r for i in todo if isinstance(r := results[i], Translation)}
        checked = await self._core.check_targets(list(done.values()))
        for index, translation in zip(done, checked, strict=True):
            results[index] = translation
        return results

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
        size = self._core.settings.max_batch_items
        long = {i for i, text in enumerate(texts) if len(text) > self._core.settings.max_text_chars}
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
                        await self._long.document(
                            text, target_lang, source_lang, deadline=deadline, paced=paced
                        )
                    )
                except ServiceError as error:
                    merged.append(error)
            return merged
        if paced:
            pace = self._core.pace()
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

    async def detect(self, texts: Sequence[str]) -> list[Detection]:
        """The detected language of each text (no model work; in the worker pool)."""
        return await self._core.preparer.detect(texts)

    async def warm_up(self) -> None:
        """One generation per prompt template, bypassing cache and admission, before serving."""
        english = self._core.languages["en"]
        for target in (self._core.languages["de"], self._core.languages["zh"]):
            (prepared,) = await self._core.preparer.prepare(
                ["Hello."], target, english, ["warm-up"]
            )
            await self._core.generator.generate(prepared.request)

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
        self._core.prompts.check(content, "messages[0].content")
        with self._core.admission.reserve(1, deadline) as reservation:
            prepared = await self._core.preparer.prepare_chat(content, decoding, max_new_tokens)
            result, origin, queue_s, inference_s = await self._core.generate(
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
            cached_tokens=result.cached_tokens,
        )
