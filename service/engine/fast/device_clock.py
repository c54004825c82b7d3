"""How long the device worked on the engine's prefills and decode steps, from CUDA events.

The host's clock cannot say this: a decode step is launched and read a turn later, and a
prefill's read waits for the step in flight as well. Events recorded on the stream around each
piece of work time it where it ran; they are read only once they have passed (``settle``, after
the step loop's own wait), so timing never makes the host wait. Off a GPU nothing is timed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class DeviceTimes:
    """Seconds the device spent, summed since start; decode steps also by batch-size bucket
    (seconds and steps), to set beside the step times the engine measured with empty rows."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_by_bucket: dict[int, tuple[float, int]] = field(default_factory=dict)


class DeviceClock:
    def __init__(self, device: torch.device) -> None:
        self._on = device.type == "cuda"
        # (bucket, or None for a prefill; start; end)
        self._pending: deque[tuple[int | None, torch.cuda.Event, torch.cuda.Event]] = deque()
        self.times = DeviceTimes()

    @property
    def on(self) -> bool:
        """Whether the device's work is timed (on a GPU)."""
        return self._on

    def start(self) -> torch.cuda.Event | None:
        """An event recorded now on the current stream (None off a GPU)."""
        if not self._on:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started: torch.cuda.Event | None, bucket: int | None = None) -> None:
        """The work enqueued since ``started`` is a decode step of ``bucket`` rows, or (None) a
        prefill."""
        if started is None:
            return
        ended = torch.cuda.Event(enable_timing=True)
        ended.record()
        self._pending.append((bucket, started, ended))

    def settle(self) -> None:
        """Add the spans that have run."""
        while self._pending and self._pending[0][2].query():
            bucket, started, ended = self._pending.popleft()
            seconds = started.elapsed_time(ended) / 1000
            if bucket is None:
                self.times.prefill_s += seconds
                continue
            self.times.decode_s += seconds
            total, steps = self.times.decode_by_bucket.get(bucket, (0.0, 0))
            self.times.decode_by_bucket[bucket] = (total + seconds, steps + 1)
