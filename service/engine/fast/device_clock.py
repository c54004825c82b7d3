"""How long the device worked on the engine's prefills and decode steps, from CUDA events.

The host's clock cannot say this: a decode step is launched and read a turn later, and a
prefill's read waits for the step in flight as well. Events recorded on the stream around each
piece of work time it where it ran; they are read only once they have passed (``settle``, after
the step loop's own wait), so timing never makes the host wait. Off a GPU nothing is timed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class DeviceTimes:
    """Seconds the device spent, summed since start."""

    prefill_s: float = 0.0
    decode_s: float = 0.0


class DeviceClock:
    def __init__(self, device: torch.device) -> None:
        self._on = device.type == "cuda"
        self._pending: deque[tuple[bool, torch.cuda.Event, torch.cuda.Event]] = deque()
        self.times = DeviceTimes()

    def start(self) -> torch.cuda.Event | None:
        """An event recorded now on the current stream (None off a GPU)."""
        if not self._on:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started: torch.cuda.Event | None, prefill: bool) -> None:
        """The work enqueued since ``started`` is a prefill (else a decode step)."""
        if started is None:
            return
        ended = torch.cuda.Event(enable_timing=True)
        ended.record()
        self._pending.append((prefill, started, ended))

    def settle(self) -> None:
        """Add the spans that have run."""
        while self._pending and self._pending[0][2].query():
            prefill, started, ended = self._pending.popleft()
            seconds = started.elapsed_time(ended) / 1000
            if prefill:
                self.times.prefill_s += seconds
            else:
                self.times.decode_s += seconds
