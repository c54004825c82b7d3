"""One SQLite file shared by the API processes of a service: opened on first use with its
schema, WAL journal (readers never wait for a writer across processes), one connection per
process guarded by a lock, each ``transaction`` committed or rolled back whole. A full disk,
whether SQLite or a file write finds it, is ``StorageFull`` (``disk_space``)."""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from service.contract.errors import StorageFull

_FULL = "the service's storage is full; try again later"
# How long a statement waits for another process's lock on the file.
BUSY_S = 10.0


def while_locked(action: Callable[[], None], seconds: float = BUSY_S) -> None:
    """``action`` (setting a file up), again while SQLite says "database is locked" at once.
    The API processes of a service start together, and switching a file to WAL while another
    process writes it is refused without SQLite's busy wait, which would deadlock there."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def disk_space() -> Iterator[None]:
    """A write that finds the disk (or its quota) full raises ``StorageFull`` instead: a 507
    the client can retry, not an internal error."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise StorageFull(_FULL) from error
        raise
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(_FULL) from error
        raise


class Database:
    def __init__(
        self,
        path: Path,
        schema: str,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """``migrate``: brings a file of an earlier layout up to ``schema`` (before it runs)."""
        self._path = path
        self._schema = schema
        self._migrate = migrate
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self._path, check_same_thread=False, timeout=BUSY_S)

            def set_up() -> None:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA foreign_keys=ON")
                if self._migrate is not None:
                    self._migrate(connection)
                connection.executescript(self._schema)

            while_locked(set_up)
            self._connection = connection
        return self._connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock, disk_space():
            connection = self._connect()
            with connection:
                yield connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
