"""Runs document jobs in the API process that accepted them: units translated through the
translator, progress and heartbeats written to the job store, the result rebuilt and stored.

At most ``max_running`` jobs translate at once in a process; more wait queued. Units are sent
a few at a time, so a document shares the engine with live requests rather than filling the
queue: a full queue (``Overloaded``) makes the job wait and try again, never fail. A job that
fails says why in its status. The runner's claim names this process in the job store: its
heartbeat keeps its jobs, a job another process took over (or that was deleted) stops here, and
the process stopping hands its jobs back to be resumed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.contract.errors import ServiceError
from service.frontend.documents.formats import Unit
from service.frontend.documents.jobs import JobStore
from service.frontend.documents.records import HEARTBEAT_S, Job
from service.frontend.policy.admission import patiently
from service.frontend.translation.prompts import TranslationOptions
from service.frontend.translation.results import Translation
from service.frontend.translation.translator import Translator

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    max_running: int = 2
    # Units of one job in the engine at once (``text`` units go in slices of the batch size).
    units_in_flight: int = 4
    # The deadline of each unit's translation.
    unit_timeout_s: float = 600.0


class JobFiles(Protocol):
    """A job's stored file: what it holds to translate, and it with its translations."""

    async def units(self, job: Job) -> list[Unit]: ...

    async def rebuilt(self, job: Job, translations: list[str]) -> bytes: ...


class DocumentRunner:
    """Translates the jobs submitted to it, in the background."""

    def __init__(
        self,
        store: JobStore,
        translator: Callable[[], Translator],
        files: JobFiles,
        config: RunnerConfig | None = None,
    ) -> None:
        # This process's claim on the jobs it runs.
        self.claim = uuid.uuid4().hex
        self._store = store
        self._translator = translator
        self._files = files
        self._config = config or RunnerConfig()
        self._running = asyncio.Semaphore(self._config.max_running)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._heart: asyncio.Task[None] | None = None

    @property
    def has_room(self) -> bool:
        """Whether a job taken on now would start at once."""
        return len(self._tasks) < self._config.max_running

    def submit(
        self, job: Job, options: TranslationOptions, units: list[Unit] | None = None
    ) -> None:
        """Translate ``job`` (claimed by this runner) in the background; ``units``, its file's
        when just read, kept only if it starts at once: a job that waits holds none of its
        document in memory (it is read again when it starts), however many wait."""
        if not self.has_room:
            units = None
        task = asyncio.create_task(self._run(job, units, options), name=f"document-{job.id}")
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))
        if self._heart is None or self._heart.done():
            self._heart = asyncio.create_task(self._beat(), name="document-heartbeat")

    def cancel(self, job_id: str) -> None:
        """Stop translating ``job_id`` if it runs here (its job was deleted)."""
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()

    async def wait(self, job_id: str) -> None:
        """Until the job's translation ends here (at once when it does not run here)."""
        task = self._tasks.get(job_id)
        if task is not None:
            # Not ``shield``: a job cancelled here (deleted, or taken over) would raise its
            # cancellation into the waiting request. ``wait`` neither raises it nor cancels
            # the job when the request itself is cancelled.
            await asyncio.wait({task})

    async def close(self) -> None:
        """Stop every job and the heartbeat, and hand the jobs back to be resumed."""
        running = list(self._tasks)
        tasks = [*self._tasks.values(), *([self._heart] if self._heart else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._store.claims.release, running, self.claim)

    async def _beat(self) -> None:
        while self._tasks:
            gone = await asyncio.to_thread(self._store.claims.beat, list(self._tasks), self.claim)
            for job_id in gone:
                self.cancel(job_id)
            await asyncio.sleep(HEARTBEAT_S)

    async def _run(self, job: Job, units: list[Unit] | None, options: TranslationOptions) -> None:
        # Cancelled (the job deleted, taken over elsewhere, or this process stopping), it is
        # left as it is: it either is gone, runs elsewhere, or is handed back by ``close``.
        try:
            async with self._running:
                await asyncio.to_thread(self._store.start, job)
                if units is None:
                    units = await self._files.units(job)
                translations = await self._translate(job, units, options)
                result = await self._files.rebuilt(job, translations)
                await asyncio.to_thread(self._store.finish, job, result)
        except ServiceError as error:
            await asyncio.to_thread(self._store.fail, job, error.message)
        except Exception:
            log.exception("document translation failed", extra={"document_id": job.id})
            await asyncio.to_thread(self._store.fail, job, "internal error")

    async def _translate(
        self, job: Job, units: Sequence[Unit], options: TranslationOptions
    ) -> list[str]:
        """One translation per unit, in order, a few units at a time."""
        translator = await patiently(
            self._serving_translator, time.monotonic() + self._config.unit_timeout_s
        )
        out: list[str] = [""] * len(units)
        groups = _groups(units, translator.max_batch_items)
        done = 0
        gate = asyncio.Semaphore(self._config.units_in_flight)

        async def run(indexes: list[int]) -> None:
            nonlocal done
            async with gate:
                deadline = time.monotonic() + self._config.unit_timeout_s
                texts = await patiently(
                    lambda: self._once(translator, job, [units[i] for i in indexes], options),
                    deadline,
                )
            for index, text in zip(indexes, texts, strict=True):
                out[index] = text
            done += sum(units[i].characters for i in indexes)
            await asyncio.to_thread(self._store.progress, job, done)

        await asyncio.gather(*(run(group) for group in groups))
        return out

    async def _serving_translator(self) -> Translator:
        """The translator, or why the service does not translate now (the model loading: the
        job waits for it)."""
        return self._translator()

    async def _once(
        self, translator: Translator, job: Job, units: list[Unit], options: TranslationOptions
    ) -> list[str]:
        deadline = time.monotonic() + self._config.unit_timeout_s
        kind = units[0].kind
        if kind == "document":
            (unit,) = units
            translation = await translator.document(
                unit.text,
                job.target_lang,
                job.source_lang,
                deadline=deadline,
                options=options,
                paced=True,
            )
            return [translation.text]
        if kind == "text":
            outcomes = await translator.translate_batch(
                [unit.text for unit in units],
                job.target_lang,
                job.source_lang,
                deadline=deadline,
                options=options,
            )
        else:
            outcomes = await translator.translate_markup(
                [unit.text for unit in units],
                job.target_lang,
                job.source_lang,
                deadline=deadline,
                inline=frozenset().union(*(unit.inline for unit in units)),
                paced=True,
            )
        return [_text(outcome) for outcome in outcomes]


def _text(outcome: Translation | ServiceError) -> str:
    if isinstance(outcome, ServiceError):
        raise outcome
    return outcome.text


def _groups(units: Sequence[Unit], batch: int) -> list[list[int]]:
    """Unit indexes in the groups sent together: consecutive ``text`` or ``markup`` units up to
    ``batch`` of them, each ``document`` unit alone."""
    groups: list[list[int]] = []
    for index, unit in enumerate(units):
        last = groups[-1] if groups else None
        if (
            last is not None
            and unit.kind != "document"
            and units[last[0]].kind == unit.kind
            and len(last) < batch
        ):
            last.append(index)
        else:
            groups.append([index])
    return groups


def options_json(options: TranslationOptions) -> str:
    """The options asked, for the job's record."""
    return json.dumps({name: True for name in options.asked()})
