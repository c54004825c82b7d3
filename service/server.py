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
import time
from collections.abc import Callable, Collection
from http import HTTPStatus
from types import FrameType
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from service.api.middleware import Door
from service.config import Settings
from service.runtime import Runtime

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


class _CoalescedWrites:
    """A transport whose writes within one turn of the event loop leave as one write.

    uvicorn writes a response's head and its body separately, and each write to a socket is a
    system call (on loopback the receiving side's processing runs inside it as well): a
    refusal's two writes were a quarter of the API process's time under a flood.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            if not self._transport.is_closing():
                self._transport.write(b"".join(pending))

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class ServiceHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with two shortcuts for the answers a flood gets most.

    - Each response leaves in one system call (``_CoalescedWrites``).
    - A request the app's ``Door`` refuses (a translation while admission is full) is answered
      here, once its head is parsed, without becoming an ASGI request: no task, no middleware,
      no framework, which is most of what such a refusal cost. Its body is skipped by the
      parser as for any finished response, and the connection is kept alive as HTTP says.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._door: Door | None = getattr(config, "door", None)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalesced = _CoalescedWrites(transport, asyncio.get_running_loop())
        super().connection_made(coalesced)  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        started = time.perf_counter()
        door = self._door
        scope = cast(Scope, cycle.scope)
        refusal = door.refusal(scope) if door is not None else None
        if refusal is None:
            super()._start_asgi_task(cycle, app)
            return
        assert door is not None
        status = refusal.status_code
        head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        for name, value in (*self.server_state.default_headers, *refusal.raw_headers):
            head += (name, b": ", value, b"\r\n")
        head += (b"x-request-id: ", door.request_id(scope).encode(), b"\r\n")
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        self.transport.write(b"".join((*head, b"\r\n", refusal.body)))
        # As uvicorn's own cycle ends a response: later body bytes are ignored, the connection
        # is closed or kept alive, and a pipelined request (if any) is started.
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        door.record(scope, time.perf_counter() - started)


class ServiceConfig(uvicorn.Config):
    """uvicorn's config, carrying the app's door to the protocol."""

    def __init__(self, app: ASGIApp, *, door: Door | None, **options: Any) -> None:
        super().__init__(app, **options)
        self.door = door


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    return ServiceConfig(
        app,
        door=getattr(app.state, "door", None),
        host=settings.host,
        port=settings.port,
        timeout_keep_alive=settings.timeout_keep_alive_s,
        backlog=settings.listen_backlog,
        # Requests are answered by the drain already; this only bounds slow client writes.
        timeout_graceful_shutdown=5,
        log_config=None,
        http=ServiceHttpProtocol,
        # Several API processes are started by ``service.launcher``, not by uvicorn: they share
        # one engine process, which uvicorn's workers would not.
        workers=1,
    )


def shared_port_socket(settings: Settings) -> socket.socket:
    """A socket bound to the settings' address that other processes may bind as well
    (SO_REUSEPORT): the kernel spreads new connections evenly over all that listen. uvicorn
    makes it listen once the app has started."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
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
    holder: list[DrainingServer] = []
    app = make_app(lambda: holder[0].fatal())
    server = DrainingServer(
        uvicorn_config(app, settings),
        app.state.runtime,
        settings.drain_timeout_s,
        signals=signals,
        parent_sentinel=parent_sentinel,
    )
    holder.append(server)
    server.run(sockets=sockets)
    return server.exit_code


def _stopped(signum: int, frame: FrameType | None) -> None:
    log.info("stopped", extra={"signal": signal.Signals(signum).name})
