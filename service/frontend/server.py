"""One API process's HTTP server: uvicorn around one app, with a shutdown that drains first.

Shutdown order matters: on SIGTERM (or SIGINT) the runtime drains first (admission closes, new
requests get a JSON 503 with Retry-After, texts in flight get ``drain_timeout_s`` to finish and
the rest a JSON 503), and only then is uvicorn told to stop. Left to itself, uvicorn would cancel
the request tasks still running (text/plain 500s) before the lifespan's drain ever ran. A second
signal stops at once. Exit status: 0 after a drain; 1 when the engine could not be (re)started
or the process lost the launcher it was started by.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Collection
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.config.settings import Settings
from service.frontend.doorway import Doorway, ServiceConfig
from service.frontend.open_files import DEFAULT_OPEN_FILES, OpenFiles, reserve_open_files
from service.frontend.protocol import HeadLimits
from service.frontend.runtime import Runtime

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the runtime before stopping."""

    def __init__(
        self,
        config: uvicorn.Config,
        runtime: Runtime,
        drain_timeout_s: float,
        *,
        signals: Collection[int] = (signal.SIGTERM, signal.SIGINT),
        parent_sentinel: int | None = None,
    ) -> None:
        """``signals``: those that stop it (others uvicorn catches are ignored);
        ``parent_sentinel``: the launcher's sentinel, whose end stops this server with 1."""
        super().__init__(config)
        self._runtime = runtime
        self._drain_timeout_s = drain_timeout_s
        self._signals = frozenset(signals)
        self._parent_sentinel = parent_sentinel
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self.exit_code = 0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if isinstance(self.config, ServiceConfig):
            # Admitted requests start only once no connection waits to be accepted (``Starts``).
            self.config.admitting_starts.watch(
                listening.fileno() for server in self.servers for listening in server.sockets
            )

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        if self._parent_sentinel is not None:
            self._loop.add_reader(self._parent_sentinel, self._orphaned)
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig not in self._signals:
            return
        if self._draining or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._draining = True
        log.info("stopping", extra={"signal": signal.Signals(sig).name})
        self._loop.call_soon_threadsafe(
            lambda: self._loop and self._loop.create_task(self._drain())
        )

    def fatal(self) -> None:
        """The engine cannot be (re)started: stop with status 1 for the orchestrator."""
        self.exit_code = 1
        self.should_exit = True

    def _orphaned(self) -> None:
        assert self._loop is not None
        assert self._parent_sentinel is not None
        self._loop.remove_reader(self._parent_sentinel)
        log.error("the launcher is gone; stopping")
        self.exit_code = 1
        if not self._draining:
            self._draining = True
            self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self._runtime.drain(self._drain_timeout_s)
        finally:
            self.should_exit = True


def uvicorn_config(app: FastAPI, settings: Settings) -> ServiceConfig:
    return ServiceConfig(
        app,
        door=getattr(app.state, "door", None),
        head_limits=HeadLimits(
            settings.server.max_header_bytes,
            settings.server.max_headers,
            settings.server.request_head_timeout_s,
            settings.server.request_body_timeout_s,
        ),
        host=settings.server.host,
        port=settings.server.port,
        timeout_keep_alive=settings.server.timeout_keep_alive_s,
        backlog=settings.server.listen_backlog,
        # Requests are answered by the drain already; this only bounds slow client writes.
        timeout_graceful_shutdown=5,
        log_config=None,
        # Each connection starts at the doorway, which hands it to ServiceHttpProtocol.
        http=Doorway,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: only from the
        # configured proxies here, or from nobody.
        proxy_headers=bool(settings.server.trusted_proxies),
        forwarded_allow_ips=list(settings.server.trusted_proxies) or [],
        # Several API processes are started by ``service.launcher``, not by uvicorn: they share
        # one engine process, which uvicorn's workers would not.
        workers=1,
    )


def shared_port_socket(settings: Settings) -> socket.socket:
    """A socket bound to the settings' address that other processes may bind as well
    (SO_REUSEPORT): the kernel spreads new connections evenly over all that listen. uvicorn
    makes it listen once the app has started."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        settings.server.host, settings.server.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def serve(
    settings: Settings,
    make_app: Callable[[Callable[[], None]], FastAPI],
    *,
    sockets: list[socket.socket] | None = None,
    signals: Collection[int] = (signal.SIGTERM, signal.SIGINT),
    parent_sentinel: int | None = None,
) -> int:
    """Serve the app ``make_app(on_fatal)`` builds until it is stopped; its exit status."""
    # uvicorn raises the signal it caught again once it has stopped; with the default handlers
    # that would end the process "killed by SIGTERM". These make a completed drain exit 0.
    for signum in signals:
        signal.signal(signum, _stopped)
    # Before the app starts its threads and any connection comes (see ``open_files``).
    reserve_files(settings)
    holder: list[DrainingServer] = []
    app = make_app(lambda: holder[0].fatal())
    server = DrainingServer(
        uvicorn_config(app, settings),
        app.state.runtime,
        settings.reliability.drain_timeout_s,
        signals=signals,
        parent_sentinel=parent_sentinel,
    )
    holder.append(server)
    server.run(sockets=sockets)
    return server.exit_code


def _stopped(signum: int, frame: FrameType | None) -> None:
    log.info("stopped", extra={"signal": signal.Signals(signum).name})


def reserve_files(settings: Settings) -> OpenFiles:
    """The process's open files reserved as the settings want (``open_files``), a shortfall
    logged."""
    asked = settings.server.open_files
    wanted = DEFAULT_OPEN_FILES if asked is None else asked
    files = reserve_open_files(wanted)
    if files.table < wanted:
        # Asked for (HYMT_OPEN_FILES), a shortfall is the operator's to know; unset, the system
        # simply allows fewer (a hard limit under the default, macOS's cap under an unlimited one).
        level = logging.INFO if asked is None else logging.WARNING
        log.log(
            level,
            "fewer open files than wanted: the system's limit is lower",
            extra={"wanted": wanted, "limit": files.limit},
        )
    return files
