"""Hy-MT2's delimiter option kept exactly: where a translation comes back with another count of
the delimiter, its pieces are translated one by one and joined with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from service.contract.errors import ServiceError
from service.frontend.translation.results import (
    InBatches,
    Translation,
)


async def keep_delimiters(
    in_batches: InBatches,
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
    again = await in_batches([core for _, _, core in cores], target_lang, source_lang, deadline)
    translated: dict[tuple[int, int], Translation | ServiceError] = {
        (index, number): outcome for (index, number, _), outcome in zip(cores, again, strict=True)
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
