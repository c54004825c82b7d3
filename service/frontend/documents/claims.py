"""Which process runs which document job, across the API processes of one service: a job is
held by the claim of the process running it while that process's heartbeat keeps it. One whose
heartbeat stopped (its process crashed, or the service restarted) is claimed by the next process
to look and run again from its stored file, at most ``MAX_ATTEMPTS`` times in all: a document
that brings its process down every time fails instead of taking the service down for ever. A
process stopping hands its jobs back, and a service starting frees every unfinished one."""

from __future__ import annotations

from collections.abc import Callable

from service.frontend.documents.records import (
    COLUMNS,
    HEARTBEAT_LOST_S,
    MAX_ATTEMPTS,
    ORPHANED,
    UNFINISHED,
    Job,
)
from service.frontend.sqlite import Database


class JobClaims:
    """The claims on the jobs of one jobs file."""

    def __init__(self, database: Database, clock: Callable[[], float]) -> None:
        self._db = database
        self._clock = clock

    def claim_orphan(self, claim: str) -> Job | None:
        """The oldest unfinished job no process runs, claimed for ``claim``'s process to run
        again from the start (queued, one more attempt), or None."""
        now = self._clock()
        with self._db.transaction() as db:
            row = db.execute(
                "UPDATE jobs SET state = 'queued', heartbeat = ?, claim = ?, "
                "attempts = attempts + 1, done_characters = 0, started = NULL "
                f"WHERE id = (SELECT id FROM jobs WHERE {ORPHANED} AND request IS NOT NULL "
                f"AND attempts < ? ORDER BY created LIMIT 1) RETURNING {COLUMNS}",
                (now, claim, now - HEARTBEAT_LOST_S, MAX_ATTEMPTS),
            ).fetchone()
        return None if row is None else Job(*row)

    def fail_hopeless(self) -> int:
        """Unfinished jobs no process runs that cannot be resumed failed, saying why: those
        begun ``MAX_ATTEMPTS`` times, and those of before resuming. The number failed."""
        lost = self._clock() - HEARTBEAT_LOST_S
        with self._db.transaction() as db:
            crashed = db.execute(
                "UPDATE jobs SET state = 'error', error = 'the service stopped ' || attempts || "
                f"' times while translating this document' WHERE {ORPHANED} AND attempts >= ?",
                (lost, MAX_ATTEMPTS),
            ).rowcount
            return (
                crashed
                + db.execute(
                    "UPDATE jobs SET state = 'error', "
                    "error = 'the service restarted while translating this document' "
                    f"WHERE {ORPHANED} AND request IS NULL",
                    (lost,),
                ).rowcount
            )

    def release(self, job_ids: list[str], claim: str) -> None:
        """``claim``'s process stopping: its unfinished jobs handed back to be resumed at once
        elsewhere (a stop that was asked for does not count as an attempt)."""
        with self._db.transaction() as db:
            db.executemany(
                "UPDATE jobs SET state = 'queued', heartbeat = NULL, claim = NULL, "
                f"attempts = MAX(attempts - 1, 0) WHERE id = ? AND claim = ? AND {UNFINISHED}",
                [(job_id, claim) for job_id in job_ids],
            )

    def beat(self, job_ids: list[str], claim: str) -> set[str]:
        """The heartbeat of the jobs ``claim``'s process runs; those of ``job_ids`` it no longer
        runs (deleted, or claimed by another process after its heartbeat stopped)."""
        with self._db.transaction() as db:
            db.executemany(
                f"UPDATE jobs SET heartbeat = ? WHERE id = ? AND claim = ? AND {UNFINISHED}",
                [(self._clock(), job_id, claim) for job_id in job_ids],
            )
            mine = {
                row[0]
                for row in db.execute(
                    f"SELECT id FROM jobs WHERE claim = ? AND {UNFINISHED}", (claim,)
                )
            }
        return set(job_ids) - mine

    def requeue_unfinished(self) -> int:
        """Every unfinished job made free to be resumed at once, and every result left on its
        way done again: for a service starting, whose processes run or send none of them yet.
        The number to resume or fail."""
        with self._db.transaction() as db:
            db.execute("UPDATE jobs SET state = 'done' WHERE state = 'sending'")
            return db.execute(
                "UPDATE jobs SET state = 'queued', heartbeat = NULL, claim = NULL "
                f"WHERE {UNFINISHED}"
            ).rowcount
