"""What one rate or quota count costs the process that makes it, alone or beside others.

``--processes`` processes each count characters for ``--seconds``, one count every ``--gap-ms``,
through the ``limits`` sliding-window limiter the service uses (``frontend.access``), into
``--storage``: ``file``, the SQLite file that the API processes of one host share
(``frontend.local_limits``), or ``memory``, ``limits``' own memory storage that one API process
keeps. Each process reports the wall time of its counts (p50, p99, max) and the CPU time a count
cost it (its threads included: the memory storage starts a timer thread to expire its counters).
A count on the file waits for the other processes' writes, which is why the service makes its
counts on a thread of their own and not on the event loop.

    python -m loadtests.counting --processes 8 --seconds 3 --storage file
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.loadgen import emit, percentile


@dataclass(frozen=True, slots=True)
class ProcessCounts:
    counts: int
    wall_ms_p50: float
    wall_ms_p99: float
    wall_ms_max: float
    cpu_us_per_count: float


@dataclass(slots=True)
class CountingReport:
    storage: str
    processes: int
    gap_ms: float
    by_process: list[ProcessCounts] = field(default_factory=list)


def _count(storage: str, path: str, seconds: float, gap_s: float, index: int) -> ProcessCounts:
    from limits import parse
    from limits.storage import MemoryStorage, Storage
    from limits.strategies import SlidingWindowCounterRateLimiter

    from service.frontend.local_limits import SharedFileStorage

    counters: Storage = SharedFileStorage(Path(path)) if storage == "file" else MemoryStorage()
    limiter = SlidingWindowCounterRateLimiter(counters)
    usage = parse(f"{10**15}/month")  # the service's window when no quota is set
    walls: list[float] = []
    cpu = time.process_time()
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        began = time.perf_counter()
        limiter.hit(usage, f"addr:127.0.0.{index % 4}", cost=120)
        walls.append(time.perf_counter() - began)
        if gap_s:
            time.sleep(gap_s)
    spent = time.process_time() - cpu
    return ProcessCounts(
        counts=len(walls),
        wall_ms_p50=round(percentile(walls, 0.5) * 1e3, 3),
        wall_ms_p99=round(percentile(walls, 0.99) * 1e3, 3),
        wall_ms_max=round(max(walls) * 1e3, 3),
        cpu_us_per_count=round(spent / len(walls) * 1e6, 1),
    )


def run(storage: str, processes: int, seconds: float, gap_ms: float) -> CountingReport:
    report = CountingReport(storage=storage, processes=processes, gap_ms=gap_ms)
    with tempfile.TemporaryDirectory(prefix="counting-") as folder:
        path = str(Path(folder) / "limits.sqlite3")
        jobs = [(storage, path, seconds, gap_ms / 1000, n) for n in range(processes)]
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            report.by_process = pool.starmap(_count, jobs)
    return report


def main(argv: list[str] | None = None) -> CountingReport:
    parser = argparse.ArgumentParser(prog="python -m loadtests.counting", description=__doc__)
    parser.add_argument("--storage", choices=("file", "memory"), default="file")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--gap-ms", type=float, default=0.5, help="pause after each count")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    report = run(args.storage, args.processes, args.seconds, args.gap_ms)
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
