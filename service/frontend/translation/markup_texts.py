"""HTML and XML: tags kept, the text between them translated, runs through inline elements
translated whole where their tags survive and piece by piece where they do not."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from service.contract.errors import ServiceError
from service.frontend.translation.core import TranslationCore
from service.frontend.translation.markup import Segmented, tag_sequence
from service.frontend.translation.results import (
    InBatches,
    Translation,
    combined,
)


class MarkupTexts:
    """Markup documents through ``in_batches`` (the translator's batches of any size)."""

    def __init__(self, core: TranslationCore, in_batches: InBatches) -> None:
        self._core = core
        self._in_batches = in_batches

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
        target, _ = self._core.prompts.languages_of(target_lang, source_lang)
        segmented = await self._core.preparer.segment(documents, ignore, inline)
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
                combined(
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
