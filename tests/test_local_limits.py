"""Rate and quota counters shared by the API processes of one host, in one SQLite file: a client
whose requests the kernel spreads over the processes gets exactly its allowance."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from limits import parse
from limits.strategies import SlidingWindowCounterRateLimiter

from service.contract.errors import QuotaExceeded, RateLimited
from service.frontend.access import AccessConfig, AccessControl, Client
from service.frontend.local_limits import SharedFileStorage
from service.frontend.sqlite import Database


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 20),
    costs=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5)), min_size=1, max_size=60),
)
def test_processes_sharing_the_file_grant_exactly_the_allowance(
    limit: int, costs: list[tuple[int, int]]
) -> None:
    """Hits of any cost from any of three processes: what is granted never passes the limit,
    and a hit is refused only when it would have passed it (what one process would do)."""
    with tempfile.TemporaryDirectory(prefix="limits-") as folder:
        storages = [SharedFileStorage(Path(folder) / "limits.sqlite3") for _ in range(3)]
        processes = [SlidingWindowCounterRateLimiter(storage) for storage in storages]
        item = parse(f"{limit}/hour")
        granted = 0
        for process, cost in costs:
            allowed = processes[process].hit(item, "client", cost=cost)
            assert allowed == (granted + cost <= limit)
            granted += cost if allowed else 0
        assert processes[0].get_window_stats(item, "client").remaining == limit - granted
        for storage in storages:
            storage.close()


async def test_quotas_of_two_processes_count_together(tmp_path: Path) -> None:
    config = AccessConfig(char_quota="100/day")
    first, second = (
        AccessControl(config, local=SharedFileStorage(tmp_path / "limits.sqlite3"))
        for _ in range(2)
    )
    client = Client("someone")
    await first.charge(client, 60)
    assert await second.character_usage(client) == (60, 100)
    await second.charge(client, 40)
    assert await first.character_usage(client) == (100, 100)
    with pytest.raises(QuotaExceeded):
        await second.charge(client, 1)
    first.close()
    second.close()


class _Contended(SharedFileStorage):
    """The file's counters while another process holds the write lock for ``hold_s``."""

    def __init__(self, path: Path, hold_s: float) -> None:
        super().__init__(path)
        self.hold_s = hold_s

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        time.sleep(self.hold_s)  # as SQLite's busy handler sleeps until the lock is free
        return super().incr(key, expiry, amount)


@pytest.mark.parametrize("quota", [None, "1000/day"])
async def test_a_count_waiting_for_the_files_lock_leaves_the_event_loop_free(
    tmp_path: Path, quota: str | None
) -> None:
    """While a charge waits for the counters' lock, the event loop goes on (other requests
    are read and refused meanwhile); without a quota the request does not wait at all, and a
    usage read after it still counts it."""
    access = AccessControl(
        AccessConfig(char_quota=quota), local=_Contended(tmp_path / "limits.sqlite3", 0.3)
    )
    client = Client("someone")
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    started = time.monotonic()
    charging = asyncio.create_task(access.charge(client, 7))
    await asyncio.sleep(0.1)
    assert ticks >= 5  # the loop ran while the count waited
    assert charging.done() == (quota is None)  # only a quota makes the request wait for it
    await charging
    used, _ = await access.character_usage(client)
    assert used == 7
    assert time.monotonic() - started >= 0.3
    ticker.cancel()
    access.close()


def test_expired_counters_read_as_zero_and_start_again(tmp_path: Path) -> None:
    storage = SharedFileStorage(tmp_path / "limits.sqlite3")
    assert storage.incr("k", expiry=60, amount=3) == 3
    with sqlite3.connect(tmp_path / "limits.sqlite3") as db:
        db.execute("UPDATE counters SET expires = 0")
    assert storage.get("k") == 0
    assert storage.incr("k", expiry=60) == 1


async def test_a_rate_check_waiting_for_the_files_lock_leaves_the_event_loop_free(
    tmp_path: Path,
) -> None:
    access = AccessControl(
        AccessConfig(rate_limit="1/minute"), local=_Contended(tmp_path / "limits.sqlite3", 0.3)
    )
    client = Client("someone")
    admitting = asyncio.create_task(access.admit(client))
    ticks = 0
    while not admitting.done():
        await asyncio.sleep(0.01)
        ticks += 1
    await admitting
    assert ticks >= 10  # the loop ran the whole time the check waited
    with pytest.raises(RateLimited):
        await access.admit(client)
    access.close()


@contextlib.contextmanager
def _written_by_another(path: Path) -> Iterator[None]:
    """``path`` held by another connection's write (``BEGIN IMMEDIATE``) for 0.3 s."""
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (a)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    committing = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    committing.start()
    try:
        yield
    finally:
        committing.join()
        writer.close()


def test_a_process_that_opens_the_file_while_another_writes_it_waits_for_it(
    tmp_path: Path,
) -> None:
    # Seen in make test (loadtests.counting's two processes starting together): switching the
    # file to WAL while another connection writes is refused at once, "database is locked",
    # without SQLite's busy wait. It waits now, as every other statement on the file does.
    path = tmp_path / "limits.sqlite3"
    with _written_by_another(path):
        storage = SharedFileStorage(path)
        assert storage.incr("client", 60) == 1


def test_a_store_opened_while_another_process_writes_its_file_waits_for_it(
    tmp_path: Path,
) -> None:
    # The same for the jobs and glossary files, which every API process opens as it starts.
    path = tmp_path / "jobs.sqlite3"
    database = Database(path, "CREATE TABLE IF NOT EXISTS t (v);")
    with _written_by_another(path):
        with database.transaction() as db:
            db.execute("INSERT INTO t VALUES (1)")
        database.close()
