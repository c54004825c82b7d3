"""The stall monitor: loop lag and collector passes of the API process reach /metrics."""

from __future__ import annotations

import asyncio
import gc
import time

from service.frontend.metrics import Metrics
from service.frontend.stalls import StallMonitor


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


async def test_a_blocked_loop_and_a_full_collection_are_recorded() -> None:
    metrics = Metrics()
    monitor = StallMonitor(metrics, period_s=0.01)
    monitor.start()
    try:
        await asyncio.sleep(0.03)
        # What a long synchronous step in a handler does to everyone else.
        time.sleep(0.15)  # noqa: ASYNC251
        gc.collect()
        await asyncio.sleep(0.05)
    finally:
        await monitor.stop()
    lag_count = _sample(metrics, "hymt_event_loop_lag_seconds_count")
    fast = _sample(metrics, "hymt_event_loop_lag_seconds_bucket", le="0.1")
    assert lag_count >= 3
    assert lag_count - fast >= 1  # the 150 ms stall landed above the 100 ms bucket
    assert _sample(metrics, "hymt_gc_pause_seconds_count", generation="2") >= 1


async def test_stopping_leaves_no_collector_callback_behind() -> None:
    before = list(gc.callbacks)
    monitor = StallMonitor(Metrics())
    monitor.start()
    assert len(gc.callbacks) == len(before) + 1
    await monitor.stop()
    assert gc.callbacks == before
