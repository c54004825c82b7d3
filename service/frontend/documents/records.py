"""A document job's record: its fields and states, its SQLite layout (and the migration from
the layout before jobs could resume), and the SQL that says which jobs are unfinished and which
no process runs. Shared by the job store and the claims on jobs."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

# ``sending``: a done job's result on its way to a client (done again if it does not arrive).
JobState = Literal["queued", "translating", "done", "sending", "error", "downloaded"]
# A running job's heartbeat is refreshed this often; one older than HEARTBEAT_LOST_S is dead.
HEARTBEAT_S = 2.0
HEARTBEAT_LOST_S = 15.0
# Runs of one job that may end without it finishing (a crash each) before it fails.
MAX_ATTEMPTS = 3

SCHEMA = """
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
    expires REAL NOT NULL,
    request TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    claim TEXT,
    holder TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner);
"""
COLUMNS = (
    "id, key, owner, filename, format, target_lang, source_lang, options, state, error, "
    "characters, done_characters, created, started, heartbeat, expires, request, attempts, claim, "
    "holder"
)
# Unfinished: a process runs it, or one will.
UNFINISHED = "state IN ('queued', 'translating')"
# Unfinished, and no process runs it.
ORPHANED = f"{UNFINISHED} AND (heartbeat IS NULL OR heartbeat < ?)"


# Columns a jobs file of an earlier layout lacks, and how each is added: what resuming needs
# (its jobs cannot resume), and who holds each job's slot (its owner, for those jobs).
_ADDED = {
    "request": "request TEXT",
    "attempts": "attempts INTEGER NOT NULL DEFAULT 0",
    "claim": "claim TEXT",
    "holder": "holder TEXT",
}


def migrate(connection: sqlite3.Connection) -> None:
    """A jobs file of an earlier layout brought up to this one."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(jobs)")}
    missing = [column for name, column in _ADDED.items() if columns and name not in columns]
    if missing:
        added = "".join(f"ALTER TABLE jobs ADD COLUMN {column}; " for column in missing)
        connection.executescript(f"BEGIN; {added}COMMIT;")


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
    # What resuming needs: the translation options in full (JSON; None for a job of before
    # resuming), the runs begun, and the process running it now.
    request: str | None
    attempts: int
    claim: str | None
    # Whose slot it takes: the client that uploaded it (its key, or on an open service its
    # address), so that one client of an open service cannot take every slot.
    holder: str | None

    def seconds_remaining(self, now: float) -> int | None:
        """An estimate from the pace so far (none before any progress)."""
        if self.state != "translating" or not self.started or not self.done_characters:
            return None
        pace = (now - self.started) / self.done_characters
        return max(0, round(pace * (self.characters - self.done_characters)))


def resumable(job: Job) -> bool:
    """Whether ``job`` may run again: it has its options and runs left."""
    return job.request is not None and job.attempts < MAX_ATTEMPTS
