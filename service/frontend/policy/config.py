"""The policy layer's configuration, built from the service's settings at the edge."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    # Most texts admitted and not yet answered; beyond it, 429.
    max_in_flight: int = 1024
    # API processes sharing one engine: each admits its share of max_in_flight and of the
    # engine's capacity (connections are spread evenly over the processes by the kernel).
    processes: int = 1
    # The most tokens a text may generate (admission's estimate never assumes more).
    max_new_tokens: int = 1024
    # Deadline of a request, and the least a client may ask for with X-Request-Timeout.
    request_timeout_s: float = 100.0
    min_request_timeout_s: float = 0.1
    # An engine that is busy and answers nothing for this long is stalled (killed, restarted).
    stall_timeout_s: float = 300.0
    # An engine process not heard from for this long is hung (killed, restarted).
    heartbeat_timeout_s: float = 1.0
    # Longest an engine process may take from spawn to ready.
    start_timeout_s: float = 1800.0
    # Restarts allowed within restart_window_s; one more and the service exits non-zero.
    max_restarts: int = 3
    restart_window_s: float = 600.0
    restart_backoff_s: float = 1.0
