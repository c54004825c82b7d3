"""Rate and quota counters shared by the API processes of one host, without Redis.

A ``limits`` storage over one SQLite file in the process group's folder: every API process
counts into the same rows, so a client spread over the processes by the kernel gets exactly its
allowance, as one process would give it. The sliding-window logic is the ``limits`` library's own
(the same as its memory storage: the weighted count of the previous and current windows); this
class only keeps the counters. An increment is one SQLite statement (an upsert that returns the
new count), atomic across processes; counters past their expiry read as zero and are purged now
and then. The file is in WAL mode without fsync: counts are worth nothing after a restart.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from pathlib import Path

from limits.storage.base import SlidingWindowCounterSupport, Storage, TimestampedSlidingWindow

from service.frontend.sqlite import while_locked

# Increments between two purges of the expired counters.
_PURGE_EVERY = 1000
# How long a statement waits for another process's lock on the file: shorter than the jobs and
# glossary files' wait (``sqlite.BUSY_S``), since a request's rate check waits on it.
_BUSY_S = 5.0


class SharedFileStorage(Storage, SlidingWindowCounterSupport, TimestampedSlidingWindow):
    """Counters in the SQLite file ``path``, shared by every process that opens it."""

    STORAGE_SCHEME = None

    def __init__(self, path: Path) -> None:
        super().__init__(wrap_exceptions=True)
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(
            path, timeout=_BUSY_S, isolation_level=None, check_same_thread=False
        )
        while_locked(self._set_up, _BUSY_S)
        self._increments = 0

    def _set_up(self) -> None:
        """WAL mode and the table (again while another process holds the file: ``while_locked``)."""
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=OFF")
        self._connection.execute(
            "CREATE TABLE IF NOT EXISTS counters "
            "(key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires REAL NOT NULL)"
        )

    @property
    def base_exceptions(self) -> type[Exception]:
        return sqlite3.Error

    def _run(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        with self._lock:
            return self._connection.execute(sql, args).fetchall()

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        now = time.time()
        (row,) = self._run(
            "INSERT INTO counters (key, count, expires) VALUES (?1, ?2, ?3) "
            "ON CONFLICT (key) DO UPDATE SET "
            "count = CASE WHEN expires <= ?4 THEN ?2 ELSE count + ?2 END, "
            "expires = CASE WHEN expires <= ?4 THEN ?3 ELSE expires END "
            "RETURNING count",
            key,
            amount,
            now + expiry,
            now,
        )
        self._increments += 1
        if self._increments % _PURGE_EVERY == 0:
            self._run("DELETE FROM counters WHERE expires <= ?", now)
        return int(str(row[0]))

    def decr(self, key: str, amount: int = 1) -> int:
        rows = self._run(
            "UPDATE counters SET count = MAX(0, count - ?) WHERE key = ? AND expires > ? "
            "RETURNING count",
            amount,
            key,
            time.time(),
        )
        return int(str(rows[0][0])) if rows else 0

    def get(self, key: str) -> int:
        rows = self._run(
            "SELECT count FROM counters WHERE key = ? AND expires > ?", key, time.time()
        )
        return int(str(rows[0][0])) if rows else 0

    def get_expiry(self, key: str) -> float:
        rows = self._run("SELECT expires FROM counters WHERE key = ?", key)
        return float(str(rows[0][0])) if rows else time.time()

    def check(self) -> bool:
        return True

    def reset(self) -> int | None:
        return len(self._run("DELETE FROM counters RETURNING key"))

    def clear(self, key: str) -> None:
        self._run("DELETE FROM counters WHERE key = ?", key)

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    # The sliding window, as ``limits``' memory storage computes it over its counters.

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        if amount > limit:
            return False
        now = time.time()
        previous_key, current_key = self.sliding_window_keys(key, expiry, now)
        previous, previous_ttl, current, _ = self._window(previous_key, current_key, expiry, now)
        if math.floor(previous * previous_ttl / expiry + current) + amount > limit:
            return False
        current = self.incr(current_key, 2 * expiry, amount)
        if math.floor(previous * previous_ttl / expiry + current) > limit:
            # Another process's hit came first: take this one back and refuse it.
            self.decr(current_key, amount)
            return False
        return True

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        now = time.time()
        previous_key, current_key = self.sliding_window_keys(key, expiry, now)
        return self._window(previous_key, current_key, expiry, now)

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        for window_key in self.sliding_window_keys(key, expiry, time.time()):
            self.clear(window_key)

    def _window(
        self, previous_key: str, current_key: str, expiry: int, now: float
    ) -> tuple[int, float, int, float]:
        previous, current = self.get(previous_key), self.get(current_key)
        previous_ttl = 0.0 if previous == 0 else (1 - (((now - expiry) / expiry) % 1)) * expiry
        current_ttl = (1 - ((now / expiry) % 1)) * expiry + expiry
        return previous, previous_ttl, current, current_ttl
