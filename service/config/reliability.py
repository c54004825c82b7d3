"""Deadlines, the engine's watchdog and restarts, and the drain at shutdown."""

from __future__ import annotations

from pydantic import Field

from service.config.section import Section


class ReliabilitySettings(Section):
    request_timeout_s: float = Field(
        100.0,
        gt=0,
        description="Deadline of a translation request; clients may lower it with the "
        "X-Request-Timeout header (seconds). Past it: 504, and queued work is dropped. Keep it "
        "under the proxy's proxy_read_timeout (120 s in deploy/nginx).",
    )
    min_request_timeout_s: float = Field(
        0.1,
        gt=0,
        description="Smallest X-Request-Timeout a client may send; below it the request is "
        "refused with 422 (a deadline that cannot be met is a client error, not a 504).",
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="An engine that holds work and generates nothing (no token, no model step) "
        "for this long is stalled: requests in it fail with 503, it is killed and restarted.",
    )
    prepare_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A text-preparation worker that holds jobs and answers none for this long "
        "is hung (a text that wedged its detector or tokenizer): killed, its jobs answered 503, "
        "started again. Preparing a text takes milliseconds.",
    )
    engine_heartbeat_timeout_s: float = Field(
        1.0,
        gt=0,
        description="An engine process not heard from for this long (it reports every 100 ms) "
        "is hung: killed and restarted.",
    )
    engine_start_timeout_s: float = Field(
        1800.0, gt=0, description="Longest the engine process may take from start to ready."
    )
    engine_max_restarts: int = Field(
        3,
        ge=0,
        description="Engine restarts allowed within 10 minutes (after it died, hung or "
        "stalled); one more and the service exits with status 1 for its orchestrator.",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="On shutdown (SIGTERM), seconds to finish queued work before exiting.",
    )
