"""What holds up the API process's event loop, measured: loop lag and garbage-collector passes.

The API process promises that ``/health`` and refusals answer in milliseconds whatever the GPU
does; that holds only while nothing blocks its event loop. ``StallMonitor`` makes the promise
observable in production instead of only in benchmarks:

- **loop lag**: a timer asks to wake every ``period_s``; how much later than asked it ran is the
  time the loop was busy with something else (``hymt_event_loop_lag_seconds``);
- **collector passes**: ``gc.callbacks`` times each collection by generation
  (``hymt_gc_pause_seconds``); a full pass over thousands of live requests stops every
  coroutine at once.

The callback is the interpreter's, so it is added on ``start`` and removed on ``stop``: several
apps in one process (as in tests) each record their own passes and leave nothing behind. It only
appends to a deque; the monitor's task moves the passes into the histogram. A collection can
start inside any allocation, including one made while a metric holds its (non-reentrant) lock,
so observing from the callback itself could deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from typing import Any

from service.frontend.metrics import Metrics


class StallMonitor:
    """Records loop lag and collector pauses of the process it runs in into ``metrics``."""

    def __init__(self, metrics: Metrics, period_s: float = 0.05) -> None:
        self._metrics = metrics
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self._gc_started: float | None = None
        self._passes: deque[tuple[int, float]] = deque(maxlen=10_000)

    def start(self) -> None:
        """Start on the running loop (idempotent)."""
        if self._task is not None:
            return
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="stall-monitor")

    async def stop(self) -> None:
        if self._task is None:
            return
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._record_passes()

    async def _watch(self) -> None:
        lag = self._metrics.event_loop_lag
        while True:
            asked = time.perf_counter() + self._period_s
            await asyncio.sleep(self._period_s)
            lag.observe(max(0.0, time.perf_counter() - asked))
            self._record_passes()

    def _record_passes(self) -> None:
        while self._passes:
            generation, seconds = self._passes.popleft()
            self._metrics.gc_pause.labels(generation=str(generation)).observe(seconds)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._passes.append(
                (int(info.get("generation", -1)), time.perf_counter() - self._gc_started)
            )
            self._gc_started = None
