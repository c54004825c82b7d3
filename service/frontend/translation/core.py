"""The core every translation flow runs on: one prepared text generated through the result cache
and the engine, its answer read back, its target checked, and the slot it was admitted with
given back however it ends."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator

from service.contract.types import (
    MODEL_CARD_DECODING,
    GenerationResult,
    Scheduled,
)
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission, Reservation
from service.frontend.translation.cache import ResultCache
from service.frontend.translation.detection import (
    MISMATCH_LETTERS,
    letters,
    target_mismatch,
)
from service.frontend.translation.languages import Language
from service.frontend.translation.prompt_builder import PromptBuilder
from service.frontend.translation.results import (
    Generator,
    Prepared,
    TextPreparer,
    Translation,
    TranslationConfig,
)
from service.frontend.translation.thinking import without_thoughts

log = logging.getLogger(__name__)

# An uploaded document's share of the admission bound (see ``TranslationCore.pace``).
_PACE_SHARE = 4


class TranslationCore:
    """What the flows share: the settings, the prompt builder, the preparation workers,
    admission, the cache and the generator, and the steps every flow takes."""

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
        self.settings = settings
        self.prompts = prompts
        self.generator = generator
        self.admission = admission
        self.cache = cache
        self.metrics = metrics
        self.preparer = preparer
        self.languages = prompts.languages
        self.options = prompts.options  # what the family's templates support
        self.decoding = prompts.decoding  # the model's recommended sampling

    async def run(
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
                self.generate(prepared, deadline, reservation),
                *(
                    self.generate(self.alternative(prepared, index), deadline, reservation)
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
            main, others = await self.generate(prepared, deadline, reservation), []
        result, origin, queue_s, inference_s = main
        text = self.answer(prepared, result.text)
        distinct = dict.fromkeys(
            draft
            for draft in (self.answer(prepared, other[0].text) for other in others)
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

    def answer(self, prepared: Prepared, text: str) -> str:
        """The translation in the model's answer: without a think block, tags restored."""
        if self.settings.think_tags:
            text = without_thoughts(text)
        return prepared.restore.restore(text) if prepared.restore is not None else text

    def alternative(self, prepared: Prepared, index: int) -> Prepared:
        """Another draw for ``prepared``: sampled (the model card's sampling where the service
        decodes greedily) and cached apart from the translation and the other draws."""
        decoding = MODEL_CARD_DECODING if self.decoding.greedy else self.decoding
        return dataclasses.replace(
            prepared,
            key=(*prepared.key, "alternative", index, decoding),
            request=dataclasses.replace(prepared.request, decoding=decoding),
        )

    async def generate(
        self, prepared: Prepared, deadline: float | None, reservation: Reservation
    ) -> tuple[GenerationResult, str, float, float]:
        """The result for ``prepared`` (cached, shared or generated), where it came from, and
        its time queued and generating."""
        timings: list[tuple[float, float]] = []

        async def generate() -> GenerationResult:
            # A generation shared by identical requests runs under the first one's deadline.
            scheduled = await self.generator.generate(prepared.request, deadline)
            timings.append((scheduled.queue_s, scheduled.inference_s))
            return scheduled.result

        # The dispatcher enforces the deadline (and counts it); a request that joined an
        # identical generation in flight waits under that generation's deadline.
        with released(reservation):
            result, origin = await self.cache.get_or_create(prepared.key, generate)
        if self.settings.log_texts:
            # Opt-in only: texts are user data and stay out of logs by default.
            log.info("translated", extra={"prompt": prepared.prompt, "translation": result.text})
        if origin == "hit":
            self.metrics.cache_hits.inc()
        else:
            self.metrics.cache_misses.inc()
            if origin == "shared":
                self.metrics.cache_shared.inc()
        self.metrics.cache_entries.set(len(self.cache))
        queue_s, inference_s = timings[0] if timings else (0.0, 0.0)
        return result, origin, queue_s, inference_s

    async def check_targets(self, translations: list[Translation]) -> list[Translation]:
        """The translations, flagged where one is surely in another language than its target
        (detected in the worker pool, counted by target)."""
        # Too short to judge (``target_mismatch`` says no): not sent to the detector at all.
        judged = [i for i, t in enumerate(translations) if letters(t.text) >= MISMATCH_LETTERS]
        if not judged:
            return translations
        detections = await self.preparer.detect([translations[i].text for i in judged])
        checked = list(translations)
        for index, detection in zip(judged, detections, strict=True):
            translation = translations[index]
            if target_mismatch(translation.text, translation.target, detection):
                self.metrics.target_mismatches.labels(target=translation.target.code).inc()
                checked[index] = dataclasses.replace(translation, target_mismatch=True)
        return checked

    async def streamed(
        self, prepared: Prepared, deadline: float | None, reservation: Reservation
    ) -> AsyncIterator[str | Scheduled]:
        """``prepared`` generated with its text streamed: the pieces as the engine sends them,
        the rest of the final text (what the last pieces held back), then the result. Leaving
        early cancels the generation in the engine."""
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        async def generate() -> Scheduled:
            try:
                with released(reservation):
                    return await self.generator.generate(
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

    def pace(self) -> int:
        """Texts of one uploaded document in flight at once: a quarter of what this process
        admits, so live requests and a second document still find room."""
        return max(1, self.admission.limit // _PACE_SHARE)


@contextlib.contextmanager
def released(reservation: Reservation) -> Iterator[None]:
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
