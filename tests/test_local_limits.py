"""Rate and quota counters shared by the API processes of one host, in one SQLite file: a client
whose requests the kernel spreads over the processes gets exactly its allowance."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from limits import parse
from limits.strategies import SlidingWindowCounterRateLimiter

from service.frontend.access import AccessConfig, AccessControl, Client
from service.frontend.local_limits import SharedFileStorage


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


def test_quotas_of_two_processes_count_together(tmp_path: Path) -> None:
    config = AccessConfig(char_quota="100/day")
    first, second = (
        AccessControl(config, local=SharedFileStorage(tmp_path / "limits.sqlite3"))
        for _ in range(2)
    )
    client = Client("someone")
    first.charge(client, 60)
    assert second.character_usage(client) == (60, 100)
    second.charge(client, 40)
    assert first.character_usage(client) == (100, 100)


def test_expired_counters_read_as_zero_and_start_again(tmp_path: Path) -> None:
    storage = SharedFileStorage(tmp_path / "limits.sqlite3")
    assert storage.incr("k", expiry=60, amount=3) == 3
    with sqlite3.connect(tmp_path / "limits.sqlite3") as db:
        db.execute("UPDATE counters SET expires = 0")
    assert storage.get("k") == 0
    assert storage.incr("k", expiry=60) == 1
