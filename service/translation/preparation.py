"""Per-text preparation off the API process: language detection, validation, tokenization.

These are the only per-text CPU costs before generation (detection alone is milliseconds per
text), and they hold the GIL: run in threads of the API process they starve the event loop that
answers ``/health`` and refusals. ``Preparer`` runs them in a pool of worker processes instead
(multiprocessing spawn). Each worker builds its ``PromptBuilder`` once, in the pool's initializer,
from what the engine reported (tokenizer, model fingerprint); the builder is that worker
process's own state, which is how a process pool keeps per-worker resources.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from service.engine.encoding import ChatPromptEncoder
from service.engine.protocol import TokenizerSpec
from service.translation.detection import Detection, LanguageDetector
from service.translation.languages import Language, LanguageTable
from service.translation.translator import Prepared, PromptBuilder, TranslationConfig

_builder: list[PromptBuilder] = []  # the worker process's own builder (one element)


def _initialize(config: TranslationConfig, spec: TokenizerSpec, fingerprint: str) -> None:
    # Ctrl-C reaches the whole process group; the API process decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    languages = LanguageTable()
    _builder.append(
        PromptBuilder(
            config,
            ChatPromptEncoder(spec),
            fingerprint,
            languages=languages,
            detector=LanguageDetector(languages),
        )
    )


def _prepare(
    texts: Sequence[str], target: Language, source: Language | None, fields: Sequence[str]
) -> list[Prepared]:
    builder = _builder[0]
    return [
        builder.prepare(text, target, source, field=field)
        for text, field in zip(texts, fields, strict=True)
    ]


def _settle() -> None:
    # Long enough that the pool hands the next call to another (new) worker.
    time.sleep(0.2)


def _detect(texts: Sequence[str]) -> list[Detection]:
    return [_builder[0].detect(text) for text in texts]


class Preparer:
    """Prepares texts in worker processes (implements the translator's ``TextPreparer``)."""

    def __init__(
        self, config: TranslationConfig, spec: TokenizerSpec, fingerprint: str, workers: int
    ) -> None:
        self.fingerprint = fingerprint
        self._workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_initialize,
            initargs=(config, spec, fingerprint),
        )

    async def start(self) -> None:
        """Start every worker now (each loads the detector and tokenizer), not under load."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(self._pool, _settle) for _ in range(self._workers))
        )

    async def prepare(
        self,
        texts: Sequence[str],
        target: Language,
        source: Language | None,
        fields: Sequence[str],
    ) -> list[Prepared]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, _prepare, list(texts), target, source, list(fields)
        )

    async def detect(self, texts: Sequence[str]) -> list[Detection]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _detect, list(texts))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
