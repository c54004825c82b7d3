"""How the step loop waits for the device's work: asleep in the driver or spinning on a core.

A spinning wait wakes up soonest, which a lone request's steps of a few milliseconds want. A
wait for a wide decode step or prefill lasts tens of milliseconds, and spinning through it holds
a core that the API processes need under load (a flood's refusals among them), so those sleep.
"""

from __future__ import annotations

import torch

# A decode step of at least this many rows, or a prefill of this many tokens or launched beside
# such a step, is waited for asleep.
SLEEP_FROM_ROWS = 64
SLEEP_FROM_TOKENS = 1024


def sleeps_for_decode(rows: int) -> bool:
    """Whether the wait for a decode step of ``rows`` rows sleeps."""
    return rows >= SLEEP_FROM_ROWS


def sleeps_for_prefill(tokens: int, decoding: int) -> bool:
    """Whether the wait for a prefill of ``tokens`` tokens, launched while ``decoding`` rows
    decode, sleeps."""
    return tokens >= SLEEP_FROM_TOKENS or decoding >= SLEEP_FROM_ROWS


def ready_event(sleep: bool) -> torch.cuda.Event:
    """An event recorded now on the current stream, whose ``synchronize`` sleeps in the driver
    until it passes when ``sleep`` (``cudaEventBlockingSync``), and otherwise spins."""
    event = torch.cuda.Event(blocking=sleep)
    event.record()
    return event
