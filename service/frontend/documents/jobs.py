"""Document jobs: their state in SQLite and their files under the data directory.

A job belongs to the owner that uploaded it (an API key, or the one owner of an open service;
another owner's job is "not found"). States: ``queued``, ``translating``, ``done``, ``error``
and ``downloaded`` (the result is served once: marked, and deleted, once it was sent whole).
The file of a result is written beside its final name and renamed into place before the job
says ``done``, so a job never says done over a half-written file. Which process runs a job is
``claims``'s (a job runs again elsewhere when its process stops); a running job's progress,
result and failure count only while its claim holds it. Jobs expire ``ttl_s`` after their
upload: expired ones are removed with their files.

The store is synchronous and small; callers in the event loop use ``asyncio.to_thread``. The
SQLite file is shared by the API processes of one service.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.contract.errors import NotFound, StorageFull, TooManyDocuments
from service.frontend.documents.claims import JobClaims
from service.frontend.documents.records import (
    COLUMNS,
    HEARTBEAT_LOST_S,
    SCHEMA,
    UNFINISHED,
    Job,
    migrate,
    resumable,
)
from service.frontend.sqlite import Database, disk_space

# A result claimed for sending this long ago by a process that never said how it went (it
# crashed) may be claimed again.
SENDING_LOST_S = 600.0


@dataclass(frozen=True, slots=True)
class JobLimits:
    max_jobs_per_client: int = 20
    ttl_s: float = 86_400.0


class JobStore:
    """The document jobs of one service: one SQLite file and a folder per job."""

    def __init__(
        self,
        folder: Path,
        limits: JobLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._folder = folder
        self._limits = limits or JobLimits()
        self._clock = clock
        self._db = Database(self._folder / "jobs.sqlite3", SCHEMA, migrate=migrate)
        # Which process runs which job (the same file).
        self.claims = JobClaims(self._db, clock)

    def _files(self, job_id: str) -> Path:
        return self._folder / job_id

    def source_path(self, job: Job) -> Path:
        return self._files(job.id) / f"source.{job.format}"

    def result_path(self, job: Job) -> Path:
        return self._files(job.id) / f"result.{job.format}"

    def create(
        self,
        owner: str,
        filename: str,
        file_format: str,
        data: bytes,
        target_lang: str,
        source_lang: str | None,
        options: str,
        characters: int,
        request: str,
        claim: str,
        holder: str,
    ) -> Job:
        """A queued job for ``data``, run by ``claim``'s process; ``request``: its options in
        full, to resume it from. ``TooManyDocuments`` past the bound of jobs ``holder`` (the
        client that uploads it) may hold."""
        self.purge()
        now = self._clock()
        job = Job(
            id=uuid.uuid4().hex.upper(),
            key=uuid.uuid4().hex + uuid.uuid4().hex,
            owner=owner,
            filename=filename,
            format=file_format,
            target_lang=target_lang,
            source_lang=source_lang,
            options=options,
            state="queued",
            error=None,
            characters=characters,
            done_characters=0,
            created=now,
            started=None,
            heartbeat=now,
            expires=now + self._limits.ttl_s,
            request=request,
            attempts=1,
            claim=claim,
            holder=holder,
        )
        folder = self._files(job.id)
        try:
            with disk_space():
                folder.mkdir(parents=True)
                self.source_path(job).write_bytes(data)
        except StorageFull:
            shutil.rmtree(folder, ignore_errors=True)  # no half-written file left behind
            raise
        with self._db.transaction() as db:
            # Unfinished and undownloaded jobs hold a slot; failed and downloaded ones do not.
            held, first_expiry = db.execute(
                "SELECT COUNT(*), MIN(expires) FROM jobs WHERE COALESCE(holder, owner) = ? "
                "AND state IN ('queued', 'translating', 'done', 'sending')",
                (holder,),
            ).fetchone()
            if held >= self._limits.max_jobs_per_client:
                shutil.rmtree(folder, ignore_errors=True)
                raise TooManyDocuments(
                    f"too many documents: at most {self._limits.max_jobs_per_client} held at "
                    "once; download the finished ones, or wait for the earliest to expire",
                    # The time a slot frees by itself; a download frees one at once.
                    retry_after_s=max(1.0, first_expiry - now),
                )
            db.execute(
                f"INSERT INTO jobs ({COLUMNS}) VALUES ({', '.join('?' * 20)})",
                tuple(getattr(job, name.strip()) for name in COLUMNS.split(",")),
            )
        return job

    def get(self, owner: str | None, job_id: str, key: str | None = None) -> Job:
        """The owner's job; with ``key``, only if it matches (DeepL's ``document_key``); with
        no owner, the key alone (a LibreTranslate download link). A running job whose heartbeat
        stopped that cannot be resumed is failed here, whoever reads it."""
        if owner is None and key is None:
            raise NotFound("Document not found")
        with self._db.transaction() as db:
            row = db.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if (
            row is None
            or (owner is not None and row[2] != owner)
            or (key is not None and not secrets.compare_digest(row[1], key))
        ):
            raise NotFound("Document not found")
        job = Job(*row)
        if job.state in ("queued", "translating") and self._lost(job) and not resumable(job):
            self.claims.fail_hopeless()
            return self.get(owner, job_id, key)
        return job

    def _lost(self, job: Job) -> bool:
        return job.heartbeat is None or self._clock() - job.heartbeat > HEARTBEAT_LOST_S

    def start(self, job: Job) -> None:
        now = self._clock()
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'translating', started = ?, heartbeat = ? "
                f"WHERE id = ? AND claim IS ? AND {UNFINISHED}",
                (now, now, job.id, job.claim),
            )

    def progress(self, job: Job, done_characters: int) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET done_characters = ?, heartbeat = ? WHERE id = ? AND claim IS ?",
                (done_characters, self._clock(), job.id, job.claim),
            )

    def finish(self, job: Job, result: bytes) -> None:
        """The result written and renamed into place, then the job done (if ``job``'s claim
        still holds it)."""
        final = self.result_path(job)
        partial = final.with_name(final.name + ".partial")
        try:
            with disk_space():
                partial.write_bytes(result)
                with partial.open("rb") as written:
                    os.fsync(written.fileno())
        except StorageFull:
            partial.unlink(missing_ok=True)  # the space it took is wanted
            raise
        partial.replace(final)
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'done', done_characters = characters "
                f"WHERE id = ? AND claim IS ? AND {UNFINISHED}",
                (job.id, job.claim),
            )

    def fail(self, job: Job, message: str) -> None:
        """``job`` failed, if its claim still holds it."""
        with self._db.transaction() as db:
            db.execute(
                f"UPDATE jobs SET state = 'error', error = ? WHERE id = ? AND claim IS ? "
                f"AND {UNFINISHED}",
                (message, job.id, job.claim),
            )

    def result(self, owner: str | None, job_id: str, key: str | None = None) -> tuple[Job, bytes]:
        """The done job's result, claimed for sending (``sending``): ``downloaded`` once it
        arrived, ``released`` back to ``done`` if it did not, so it is served once and never
        lost on the way."""
        job = self.get(owner, job_id, key)
        now = self._clock()
        with self._db.transaction() as db:
            claimed = db.execute(
                "UPDATE jobs SET state = 'sending', heartbeat = ? WHERE id = ? "
                "AND (state = 'done' OR (state = 'sending' AND heartbeat < ?))",
                (now, job.id, now - SENDING_LOST_S),
            ).rowcount
        if not claimed:
            if job.state in ("downloaded", "sending"):
                raise NotFound("Document already downloaded: a result is served once")
            raise NotFound(f"Document not ready: its translation is {job.state}")
        try:
            return job, self.result_path(job).read_bytes()
        except OSError:
            self.released(job)
            raise

    def downloaded(self, job: Job) -> None:
        """The result was sent whole: the job becomes ``downloaded`` and its files go."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'downloaded' WHERE id = ? AND state = 'sending'",
                (job.id,),
            )
        shutil.rmtree(self._files(job.id), ignore_errors=True)

    def released(self, job: Job) -> None:
        """The result did not arrive: ``done`` again, to be asked for again."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'done' WHERE id = ? AND state = 'sending'", (job.id,)
            )

    def delete(self, owner: str, job_id: str, key: str) -> Job:
        """The owner's job and its files gone, whatever its state (its slot is free)."""
        job = self.get(owner, job_id, key)
        with self._db.transaction() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
        shutil.rmtree(self._files(job.id), ignore_errors=True)
        return job

    def purge(self) -> None:
        """Expired jobs removed with their files."""
        with self._db.transaction() as db:
            expired = [
                row[0]
                for row in db.execute("SELECT id FROM jobs WHERE expires < ?", (self._clock(),))
            ]
            db.executemany("DELETE FROM jobs WHERE id = ?", [(job_id,) for job_id in expired])
        for job_id in expired:
            shutil.rmtree(self._files(job_id), ignore_errors=True)

    def close(self) -> None:
        self._db.close()
