"""Resuming document jobs that no process runs: every API process looks for them now and then
and, while it serves and its runner has room, claims the oldest and translates it again from
its stored file and options (a model still loading leaves them for later, so a long load does
not use up a resumed job's wait). So a crash, an out-of-memory kill or a restart loses no
accepted document, and a document that keeps bringing its process down fails after
``MAX_ATTEMPTS`` runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from service.frontend.documents.jobs import JobStore
from service.frontend.documents.records import Job
from service.frontend.documents.runner import DocumentRunner
from service.frontend.translation.prompts import TranslationOptions

log = logging.getLogger(__name__)

# How often a process looks for jobs to resume: a few heartbeats, so an orphan waits at most
# this long past the heartbeat's timeout.
RESUME_S = 5.0


def encode_request(options: TranslationOptions) -> str:
    """``options`` in full, as a job keeps them to be resumed with."""
    return msgspec.json.encode(options).decode()


def decode_request(request: str) -> TranslationOptions:
    return msgspec.json.decode(request, type=TranslationOptions)


class Resumer:
    """Claims and restarts orphaned jobs for one process's runner."""

    def __init__(
        self,
        store: JobStore,
        runner: DocumentRunner,
        serving: Callable[[], bool],
        every_s: float = RESUME_S,
    ) -> None:
        self._store = store
        self._runner = runner
        self._serving = serving
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="document-resume")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def once(self) -> int:
        """Jobs that cannot be resumed failed, then as many orphans claimed and restarted as
        the runner has room for; the number restarted."""
        await asyncio.to_thread(self._store.claims.fail_hopeless)
        restarted = 0
        while self._serving() and self._runner.has_room:
            job = await asyncio.to_thread(self._store.claims.claim_orphan, self._runner.claim)
            if job is None:
                break
            restarted += await self._restart(job)
        return restarted

    async def _loop(self) -> None:
        while True:
            try:
                await self.once()
            except Exception:  # the next round tries again; this loop must outlive any job
                log.exception("resuming documents failed")
            await asyncio.sleep(self._every_s)

    async def _restart(self, job: Job) -> int:
        assert job.request is not None  # claimed only with its options
        try:
            options = decode_request(job.request)
        except msgspec.DecodeError:
            log.exception("a document could not be resumed", extra={"document_id": job.id})
            await asyncio.to_thread(
                self._store.fail, job, "the document's options could not be read to resume it"
            )
            return 0
        log.info("document resumed", extra={"document_id": job.id, "attempt": job.attempts})
        # Its file is read again when it starts (as for any job that waited for the runner).
        self._runner.submit(job, options)
        return 1
