"""Document jobs: their state in SQLite and their files under the data directory.

A job belongs to the owner that uploaded it (an API key, or the one owner of an open service;
another owner's job is "not found"). States: ``queued``, ``translating``, ``done``, ``error``
and ``downloaded`` (the result is served once: marked, and deleted, once it was sent whole).
The file of a result is written beside its final name and renamed into place before the job
says ``done``, so a job never says done over a half-written file. A job that is running has a
heartbeat; one whose heartbeat stopped (its process crashed or the service restarted) reads as
failed. Jobs expire ``ttl_s`` after their upload: expired ones are removed with their files.

The store is synchronous and small; callers in the event loop use ``asyncio.to_thread``. The
SQLite file is shared by the API processes of one service.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.contract.errors import NotFound, TooManyDocuments
from service.frontend.sqlite import Database

# ``sending``: a done job's result on its way to a client (done again if it does not arrive).
JobState = Literal["queued", "translating", "done", "sending", "error", "downloaded"]
# A running job's heartbeat is refreshed this often; one older than HEARTBEAT_LOST_S is dead.
HEARTBEAT_S = 2.0
HEARTBEAT_LOST_S = 15.0
# A result claimed for sending this long ago by a process that never said how it went (it
# crashed) may be claimed again.
SENDING_LOST_S = 600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    owner TEXT NOT NULL,
    filename TEXT NOT NULL,
    format TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    source_lang TEXT,
    options TEXT NOT NULL,
    state TEXT NOT NULL,
    error TEXT,
    characters INTEGER NOT NULL,
    done_characters INTEGER NOT NULL,
    created REAL NOT NULL,
    started REAL,
    heartbeat REAL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner);
"""
_COLUMNS = (
    "id, key, owner, filename, format, target_lang, source_lang, options, state, error, "
    "characters, done_characters, created, started, heartbeat, expires"
)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    key: str
    owner: str
    filename: str
    format: str
    target_lang: str
    source_lang: str | None
    options: str  # JSON of the translation options asked
    state: JobState
    error: str | None
    characters: int
    done_characters: int
    created: float
    started: float | None
    heartbeat: float | None
    expires: float

    def seconds_remaining(self, now: float) -> int | None:
        """An estimate from the pace so far (none before any progress)."""
        if self.state != "translating" or not self.started or not self.done_characters:
            return None
        pace = (now - self.started) / self.done_characters
        return max(0, round(pace * (self.characters - self.done_characters)))


@dataclass(frozen=True, slots=True)
class JobLimits:
    max_jobs_per_owner: int = 20
    ttl_s: float = 86_400.0


class JobStore:
    """The document jobs of one service: one SQLite file and a folder per job."""

    def __init__(self, folder: Path, limits: JobLimits | None = None) -> None:
        self._folder = folder
        self._limits = limits or JobLimits()
        self._db = Database(self._folder / "jobs.sqlite3", _SCHEMA)

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
    ) -> Job:
        """A queued job for ``data``; ``TooManyDocuments`` past the owner's bound."""
        self.purge()
        now = time.time()
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
        )
        folder = self._files(job.id)
        folder.mkdir(parents=True)
        self.source_path(job).write_bytes(data)
        with self._db.transaction() as db:
            # Unfinished and undownloaded jobs hold a slot; failed and downloaded ones do not.
            held, first_expiry = db.execute(
                "SELECT COUNT(*), MIN(expires) FROM jobs WHERE owner = ? "
                "AND state IN ('queued', 'translating', 'done', 'sending')",
                (owner,),
            ).fetchone()
            if held >= self._limits.max_jobs_per_owner:
                shutil.rmtree(folder, ignore_errors=True)
                raise TooManyDocuments(
                    f"too many documents: at most {self._limits.max_jobs_per_owner} held at "
                    "once; download the finished ones, or wait for the earliest to expire",
                    # The time a slot frees by itself; a download frees one at once.
                    retry_after_s=max(1.0, first_expiry - now),
                )
            db.execute(
                f"INSERT INTO jobs ({_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                tuple(getattr(job, name.strip()) for name in _COLUMNS.split(",")),
            )
        return job

    def get(self, owner: str | None, job_id: str, key: str | None = None) -> Job:
        """The owner's job; with ``key``, only if it matches (DeepL's ``document_key``); with
        no owner, the key alone (a LibreTranslate download link). A running job whose heartbeat
        stopped is failed here, whoever reads it."""
        if owner is None and key is None:
            raise NotFound("Document not found")
        with self._db.transaction() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if (
            row is None
            or (owner is not None and row[2] != owner)
            or (key is not None and not secrets.compare_digest(row[1], key))
        ):
            raise NotFound("Document not found")
        job = Job(*row)
        if job.state in ("queued", "translating") and self._lost(job):
            self.fail(job.id, "the service stopped while translating this document")
            return self.get(owner, job_id, key)
        return job

    def _lost(self, job: Job) -> bool:
        return job.heartbeat is None or time.time() - job.heartbeat > HEARTBEAT_LOST_S

    def start(self, job_id: str) -> None:
        now = time.time()
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'translating', started = ?, heartbeat = ? WHERE id = ?",
                (now, now, job_id),
            )

    def beat(self, job_ids: list[str]) -> None:
        """The running jobs' heartbeat."""
        with self._db.transaction() as db:
            db.executemany(
                "UPDATE jobs SET heartbeat = ? WHERE id = ? AND state IN ('queued', 'translating')",
                [(time.time(), job_id) for job_id in job_ids],
            )

    def progress(self, job_id: str, done_characters: int) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET done_characters = ?, heartbeat = ? WHERE id = ?",
                (done_characters, time.time(), job_id),
            )

    def finish(self, job: Job, result: bytes) -> None:
        """The result written and renamed into place, then the job done."""
        final = self.result_path(job)
        partial = final.with_name(final.name + ".partial")
        partial.write_bytes(result)
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        partial.replace(final)
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'done', done_characters = characters WHERE id = ?",
                (job.id,),
            )

    def fail(self, job_id: str, message: str) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'error', error = ? WHERE id = ? "
                "AND state IN ('queued', 'translating')",
                (message, job_id),
            )

    def fail_unfinished(self, message: str) -> int:
        """Every queued or translating job failed, and every result left on its way done
        again: for a service starting, whose processes run or send none of them yet. The
        number failed."""
        with self._db.transaction() as db:
            db.execute("UPDATE jobs SET state = 'done' WHERE state = 'sending'")
            return db.execute(
                "UPDATE jobs SET state = 'error', error = ? "
                "WHERE state IN ('queued', 'translating')",
                (message,),
            ).rowcount

    def result(self, owner: str | None, job_id: str, key: str | None = None) -> tuple[Job, bytes]:
        """The done job's result, claimed for sending (``sending``): ``downloaded`` once it
        arrived, ``released`` back to ``done`` if it did not, so it is served once and never
        lost on the way."""
        job = self.get(owner, job_id, key)
        now = time.time()
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
                for row in db.execute("SELECT id FROM jobs WHERE expires < ?", (time.time(),))
            ]
            db.executemany("DELETE FROM jobs WHERE id = ?", [(job_id,) for job_id in expired])
        for job_id in expired:
            shutil.rmtree(self._files(job_id), ignore_errors=True)

    def close(self) -> None:
        self._db.close()
