"""How the service listens and answers HTTP: address, protocol limits, API processes."""

from __future__ import annotations

import ipaddress
import os
import socket

from pydantic import Field, field_validator

from service.config.section import Section


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container's cpuset), else the
    machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class ServerSettings(Section):
    host: str = Field("127.0.0.1", description="Interface uvicorn binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port uvicorn listens on.")
    root_path: str = Field(
        "", description="Path prefix when served under a sub-path behind a proxy (e.g. /mt)."
    )
    timeout_keep_alive_s: int = Field(
        75,
        ge=1,
        description="Seconds an idle keep-alive connection is kept. Must exceed the proxy's "
        "upstream keepalive_timeout, or idle upstream connections die under the proxy.",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Most bytes a request's head (request line and headers) may take; more "
        "is answered 431 and the connection closed.",
    )
    max_headers: int = Field(100, ge=10, description="Most headers a request may have (431).")
    request_head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest a client may take to send a request's head; then 408 and the "
        "connection closed.",
    )
    request_body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest a client may pause between two reads of a request's body (as "
        "nginx's client_body_timeout); then 408 and the connection closed.",
    )
    listen_backlog: int = Field(
        4096,
        ge=1,
        description="Connections the kernel queues before they are accepted (capped by "
        "net.core.somaxconn); a burst larger than the queue has its excess retried by the "
        "clients a second later.",
    )
    open_files: int | None = Field(
        None,
        ge=64,
        description="Files (connections among them) each API process may have open: its soft "
        "limit is raised to this, and the kernel's table of them grown to it at start (grown "
        "later, under a flood of new connections, each doubling of the table stalls accepting). "
        "Unset: the hard limit, at most 65,536.",
    )
    api_processes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="API processes answering HTTP in front of the one engine process, all on "
        "the same port (SO_REUSEPORT); unset: half the CPU cores, 1 to 8. Each admits its share "
        "of max_queue_size and keeps its own result cache; rate limits and quotas are counted "
        "for all of them together (in a shared file, or in Redis with redis_url).",
    )
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins allowed by CORS; empty keeps CORS off."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR) of the proxies whose X-Forwarded-For and "
        'X-Forwarded-Proto are believed, e.g. ["127.0.0.1"] for an Nginx on the same host. '
        "Empty: never (a client's own X-Forwarded-For would pick its rate and quota bucket).",
    )
    web_page: bool = Field(
        True, description="Serve the web page for people at / (and its files under /static/)."
    )
    prepare_workers: int | None = Field(
        None,
        ge=1,
        description="Worker processes that detect languages and tokenize, off the event loop "
        "(unset: a quarter of the CPU cores, 1 to 8, shared out over the API processes).",
    )
    prepare_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Added to the preparation workers' nice value, so that the event loops "
        "(refusals, probes) run first when a burst reaches the workers (0 = same priority).",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            ipaddress.ip_network(entry, strict=False)  # raises ValueError when not an address
        return value

    @property
    def processes(self) -> int:
        """API processes: as set, or half the cores (1 to 8; 1 without SO_REUSEPORT)."""
        if self.api_processes is not None:
            return self.api_processes
        if not hasattr(socket, "SO_REUSEPORT"):
            return 1
        return max(1, min(8, usable_cores() // 2))

    @property
    def preparation_workers(self) -> int:
        """Preparation workers of each API process."""
        if self.prepare_workers is not None:
            return self.prepare_workers
        # The quarter of the cores is shared by all API processes: each has workers of its own.
        return max(1, min(8, usable_cores() // 4) // self.processes)
