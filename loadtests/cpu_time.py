"""CPU time of a service and every process it started, by role, over one phase of a benchmark.

A flood's refusals wait for the API processes' event loops; whether those loops wait for a core
(the engine's host threads or the preparation workers busy beside them) or for their own work is
told by where the cores went while it lasted. Read from ``/proc`` (Linux): a process's user and
system time, its parent and its niceness. The roles: the engine process (the pid the service
logs when it starts it) and all it started; the preparation workers, which run niced
(``HYMT_PREPARE_NICENESS``, 10 by default: at 0 they count as API processes); every other
process, the launcher (the first API process) included, an API process.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class _Stat:
    parent: int
    seconds: float
    nice: int


def _stat(pid: int) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone, or not Linux
        return None
    # The name (field 2) may hold spaces and parentheses: the fields after its last ")".
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, nice 19.
    return _Stat(int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[16]))


def _all_stats() -> dict[int, _Stat]:
    stats: dict[int, _Stat] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    return stats


def sample(root: int, engine: int | None) -> dict[int, tuple[str, float]]:
    """Each process under ``root`` (``root`` too): its role and CPU seconds so far."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat.parent, []).append(pid)
    found: dict[int, tuple[str, float]] = {}
    stack = [(root, "")] if root in stats else []
    while stack:
        pid, inherited = stack.pop()
        stat = stats[pid]
        role = inherited or ("engine" if pid == engine else "")
        found[pid] = (role or ("preparation" if stat.nice > 0 else "api"), stat.seconds)
        stack.extend((child, role) for child in children.get(pid, []))
    return found


def by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float
) -> dict[str, float]:
    """CPU seconds each role spent between the two samples (a process started between them
    counts from zero; one that ended before the second is missing from it), and ``wall_s``."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        earlier = before.get(pid, (role, 0.0))[1]
        spent[role] = spent.get(role, 0.0) + max(0.0, seconds - earlier)
    result = {role: round(seconds, 2) for role, seconds in sorted(spent.items())}
    result["wall_s"] = round(wall_s, 2)
    return result


def engine_pid(log: Path) -> int | None:
    """The engine process's pid, from the service's log line that started it."""
    for line in log.read_text(errors="replace").splitlines():
        if '"engine process started"' in line:
            try:
                return int(json.loads(line)["pid"])
            except (ValueError, KeyError):
                continue
    return None


class Phase:
    """``by_role`` over a ``with`` block: ``spent`` once it has ended."""

    def __init__(self, root: int, engine: int | None) -> None:
        self._root, self._engine = root, engine
        self._before: dict[int, tuple[str, float]] = {}
        self._started = 0.0
        self.spent: dict[str, float] = {}

    def __enter__(self) -> Phase:
        self._before = sample(self._root, self._engine)
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._started
        self.spent = by_role(self._before, sample(self._root, self._engine), wall)
