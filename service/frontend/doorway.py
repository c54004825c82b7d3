"""A connection's first protocol: refusals answered before uvicorn's protocol exists.

Under a flood most connections bring one request to refuse and nothing else. uvicorn's
httptools protocol costs a connection tens of microseconds before its first byte is read (a
parser, loggers looked up, the socket's addresses asked of the kernel), and an event loop that
takes thousands of connections at once spends most of its time there; a raw responder on the
same loop takes a few. So every connection starts here: while the app's ``Door`` is closed, the
whole requests it refuses are answered from their bytes (``refusals``), and the connection is
kept alive as HTTP says; the first byte of anything else (a request the door lets in, a probe, a
head split over reads, anything unusual) hands the connection, with those bytes, to the
service's own HTTP protocol (``protocol.ServiceHttpProtocol``), which serves it from then on.

Also here: ``ServiceConfig``, uvicorn's config with what the connections of one server share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from service.frontend.api.middleware import Door
from service.frontend.protocol import HeadLimits, ServiceHttpProtocol, Starts
from service.frontend.refusals import CachedHeads, KnownHeads, door_scope, refuse_whole_requests


class Deadlines:
    """When each connection at the doorway is closed unless bytes come, all checked by one
    timer every ``period_s``: a timer of each connection's own (set, cancelled, set again) cost
    a sixth of a refusal. A connection may so stay up to ``period_s`` past its time."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self._due: dict[Doorway, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, loop: asyncio.AbstractEventLoop, connection: Doorway, seconds: float) -> None:
        self._due[connection] = loop.time() + seconds
        if self._timer is None:
            self._timer = loop.call_later(self.period_s, self._sweep, loop)

    def forget(self, connection: Doorway) -> None:
        self._due.pop(connection, None)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for connection in [c for c, due in self._due.items() if due <= now]:
            del self._due[connection]
            connection.shutdown()
        self._timer = loop.call_later(self.period_s, self._sweep, loop) if self._due else None


class ServiceConfig(uvicorn.Config):
    """uvicorn's config, carrying the app's door and the head limits to the connections, and
    what the connections of one server share."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        door: Door | None,
        head_limits: HeadLimits | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, **options)
        self.door = door
        self.head_limits = head_limits or HeadLimits()
        self.refusal_heads = CachedHeads()
        self.known_heads = KnownHeads()
        self.admitting_starts = Starts(None if door is None else door.refused)
        self.deadlines = Deadlines()


class Doorway(asyncio.Protocol):
    """One connection until its first byte the door does not refuse (see the module)."""

    __slots__ = (
        "_app_state",
        "_config",
        "_loop",
        "_paused",
        "_state",
        "_transport",
        "_waiting",
    )

    def __init__(
        self,
        config: ServiceConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """The arguments uvicorn gives its protocol class, passed on at the hand-over."""
        self._config = config
        self._state = server_state
        self._app_state = app_state
        self._loop = _loop or asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._paused = False  # reading, because the answers back up
        # A request let in for admission, waiting for its turn to be handed over
        # (``_wait_for_turn``): its bytes and the door's count of it as on its way.
        self._waiting: tuple[bytes, Callable[[], None]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        # Counted with uvicorn's connections, so that a shutdown closes this one too.
        self._state.connections.add(self)  # type: ignore[arg-type]
        # A connection that sends nothing is closed after the time a head may take (uvicorn's
        # protocol times nothing before the first byte).
        config = self._config
        config.deadlines.wait(self._loop, self, config.head_limits.head_timeout_s)

    def data_received(self, data: bytes) -> None:
        config = self._config
        door = config.door
        if door is not None and door.closed():
            answers, data = refuse_whole_requests(
                door,
                config.refusal_heads,
                self._state.default_headers,
                config.root_path,
                data,
                config.known_heads,
            )
            if answers:
                assert self._transport is not None
                self._state.total_requests += len(answers)
                self._transport.write(b"".join(answers))
                if not data:  # idle again: closed after keep-alive's time unless more comes
                    config.deadlines.wait(self._loop, self, config.timeout_keep_alive)
                    return
        if door is not None and self._wait_for_turn(door, data):
            return
        self._hand_over(data)

    def _wait_for_turn(self, door: Door, data: bytes) -> bool:
        """Whether ``data`` begins with a whole request the door lets in for admission, now
        counted as on its way and queued to be handed over in its turn (``Starts``).

        Handing a connection over builds uvicorn's protocol (a parser, loggers looked up, the
        socket's addresses asked of the kernel) and parses the request: tens of microseconds,
        on the event loop. A flood's admitted share is read first, before the door closes, so
        done at once that work stood in front of every refusal read after it in the same turn.
        The request's own start waited for its turn already (``Starts``); now the hand-over
        waits with it, reading paused meanwhile."""
        whole = self._config.known_heads.whole_request(data)
        if whole is None:
            return False
        path, request_id, _length = whole
        arrived = door.arrive(door_scope(path, request_id, self._config.root_path))
        if arrived is None:  # not a request for admission: no reason to wait
            return False
        assert self._transport is not None
        self._config.deadlines.forget(self)  # its head has come; its turn is not the client's
        self._waiting = (data, arrived)
        if not self._paused:
            self._transport.pause_reading()
        self._config.admitting_starts.add(self._loop, self._turn)
        return True

    def _turn(self) -> None:
        """The waiting request's turn: handed over, or, if the client left meanwhile, no longer
        counted as on its way."""
        assert self._waiting is not None
        (data, arrived), self._waiting = self._waiting, None
        transport = self._transport
        if transport is None or transport.is_closing():
            arrived()
            return
        if not self._paused:
            transport.resume_reading()
        self._hand_over(data, arrived)

    def pause_writing(self) -> None:
        # The answers back up (a client that sends without reading): reading stops until they
        # drain, and TCP holds the client back; otherwise every answer would be kept here.
        assert self._transport is not None
        self._paused = True
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None  # the client is done sending, and every request it sent is answered: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._config.deadlines.forget(self)
        self._state.connections.discard(self)
        self._transport = None  # a request waiting for its turn is let go then

    def shutdown(self) -> None:
        """uvicorn's shutdown: nothing is in flight here (a request waiting for its turn has not
        started), so the connection closes now."""
        if self._transport is not None:
            self._transport.close()

    def _hand_over(self, data: bytes, arrived: Callable[[], None] | None = None) -> None:
        """The connection to the HTTP protocol, with ``data``; ``arrived``: its first request
        was let in and counted as on its way here, and its turn has come."""
        transport = self._transport
        assert transport is not None
        self._config.deadlines.forget(self)
        self._state.connections.discard(self)
        if self._paused:  # the HTTP protocol keeps its own flow control from here on
            self._paused = False
            transport.resume_reading()
        protocol = ServiceHttpProtocol(
            config=self._config,
            server_state=self._state,
            app_state=self._app_state,
            _loop=self._loop,
        )
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.let_in_first(arrived)
        try:
            protocol.data_received(data)
        finally:
            protocol.let_in_first(None)  # not started (the parser answered it): let it go
