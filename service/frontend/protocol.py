"""The service's HTTP/1.1 protocol: uvicorn's httptools protocol with what a flood and a hostile
client need (refusals below ASGI, admitted requests started one per turn, one write per answer,
head limits and read timeouts in the service's JSON shape)."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import select
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from service.frontend.api.middleware import Door
from service.frontend.refusals import CachedHeads, KnownHeads, refuse_whole_requests


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
    """uvicorn's httptools protocol, with shortcuts for what a flood brings most.

    - A request the app's ``Door`` refuses (a translation while admission is full) is answered
      here without becoming an ASGI request: no task, no middleware, no framework. A plain one
      all in the bytes just read is answered before the parser sees it
      (``_refuse_whole_requests``); any other once its head is parsed (``_start_asgi_task``),
      its body then skipped by the parser as for any finished response. The connection is kept
      alive as HTTP says.
    - A request the door lets in for admission starts one per turn of the event loop
      (``Starts``), counted by the door as on its way until its first step has run.
    - Each response leaves in one system call (``_CoalescedWrites``).
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._door: Door | None = getattr(config, "door", None)
        self._raw: asyncio.Transport | None = None
        self._mid_message = False  # the parser holds part of a request
        self._heads: CachedHeads = getattr(config, "refusal_heads", None) or CachedHeads()
        self._known: KnownHeads | None = getattr(config, "known_heads", None)
        self._starts: Starts = getattr(config, "admitting_starts", None) or Starts()
        self._limits: HeadLimits = getattr(config, "head_limits", None) or HeadLimits()
        # Bytes read since the current request's head began (while it is not complete), and
        # its headers so far: httptools itself buffers a head of any size.
        self._head_open = True
        self._head_bytes = 0
        self._headers = 0
        # Bytes of the request line and headers parsed (a head read in one piece is counted
        # here, where the bytes read so far are not).
        self._parsed_head = 0
        self._head_too_large = False
        # The read timeout running: the whole head's, or the body's between two reads.
        self._read_timer: asyncio.TimerHandle | None = None
        # Reading paused by the refusals written here, until the transport drains.
        self._paused_for_writes = False
        # The first request, let in at the doorway and counted there as on its way, whose turn
        # to start has come (``let_in_first``).
        self._let_in: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        coalesced = _CoalescedWrites(transport, asyncio.get_running_loop())
        super().connection_made(coalesced)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        self._mid_message = True
        self._headers = 0
        self._parsed_head = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self._limits.max_headers:
            self._head_too_large = True
            raise ValueError("too many headers")  # httptools ends the parse: send_400_response
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._parsed_head += size
        if self._parsed_head > self._limits.max_header_bytes:
            self._head_too_large = True
            raise ValueError("head too large")  # as above: 431

    def on_headers_complete(self) -> None:
        self._head_open, self._head_bytes = False, 0
        self._time_reads(self._limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._mid_message = False
        self._head_open, self._head_bytes = True, 0
        self._time_reads(None)
        super().on_message_complete()

    def _time_reads(self, seconds: float | None) -> None:
        """Start (or stop, with None) the read timeout: a client that sends a head or a body
        too slowly (slowloris) is answered 408 and its connection closed."""
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None if seconds is None else self.loop.call_later(seconds, self._slow)

    def _slow(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # an answer is half sent: no room for another
            return
        body = b'{"error":{"code":"request_timeout","message":"the request was sent too slowly"}}'
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
        )
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        partial_head = self._head_open and (self._mid_message or self._head_bytes > 0)
        if partial_head and not self.transport.is_closing():
            # Part of the next head came while this request was answered: its time starts now.
            self._time_reads(self._limits.head_timeout_s)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._paused_for_writes:
            self._paused_for_writes = False
            self.flow.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._time_reads(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_open:
            idle = self.cycle is None or self.cycle.response_complete
            if self._head_bytes == 0 and idle:  # a new request's head begins: it has this long
                self._time_reads(self._limits.head_timeout_s)
            self._head_bytes += len(data)
        elif self._mid_message:  # more of a body: the next read has this long again
            self._time_reads(self._limits.body_timeout_s)
        door = self._door
        if (
            door is not None
            and self._let_in is None  # counted as on its way: the door may be full of itself
            and door.closed()
            and not self._mid_message
            and not self.pipeline
            and (self.cycle is None or self.cycle.response_complete)
        ):
            data = self._refuse_whole_requests(door, data)
            if not data:
                return
        super().data_received(data)
        if (
            self._head_open
            and self._head_bytes > self._limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._head_too_large = True
            self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, in the service's JSON error shape
        (uvicorn's is text/plain); 431 for a head over the limits."""
        if self._head_too_large:
            status, code = 431, "headers_too_large"
            message = (
                f"request head over {self._limits.max_header_bytes} bytes or "
                f"{self._limits.max_headers} headers"
            )
        else:
            status, code, message = 400, "bad_request", "invalid HTTP request"
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _refuse_whole_requests(self, door: Door, data: bytes) -> bytes:
        """Answer the refused requests at the start of ``data`` that it holds whole
        (``refusals``); the rest, for the parser."""
        answers, data = refuse_whole_requests(
            door, self._heads, self.server_state.default_headers, self.root_path, data, self._known
        )
        if answers:
            assert self._raw is not None
            self._head_bytes = len(data)
            self.server_state.total_requests += len(answers)
            self._unset_keepalive_if_required()
            self._raw.write(b"".join(answers))
            if self.flow.write_paused and not self.flow.read_paused:
                # The answers back up (a client that sends without reading): stop reading
                # until they drain, or every answer would be kept here (``resume_writing``).
                self._paused_for_writes = True
                self.flow.pause_reading()
            if not data:
                self._time_reads(None)  # answered whole: idle again, under keep-alive's timer
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
        return data

    def _start(self, cycle: RequestResponseCycle, app: Any, arrived: Callable[[], None]) -> None:
        async def arriving(scope: Scope, receive: Receive, send: Send) -> None:
            # Here, at the start of the task's first step: from here to admission it runs
            # without a pause, so no other request's door sees it counted twice or not at all,
            # and its own check in the middleware does not count it as on its way.
            arrived()
            await app(scope, receive, send)

        super()._start_asgi_task(cycle, cast(Any, arriving))

    def let_in_first(self, arrived: Callable[[], None] | None) -> None:
        """The next request parsed was let in at the doorway and its turn has come: it starts
        at once, counted as on its way (``arrived``) until its first step. None: any such
        request not started by then (the parser answered it) is no longer on its way."""
        if self._let_in is not None:
            self._let_in()
        self._let_in = arrived

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        let_in, self._let_in = self._let_in, None
        if let_in is not None:
            self._start(cycle, app, let_in)
            return
        started = time.perf_counter()
        door = self._door
        scope = cast(Scope, cycle.scope)
        refusal = door.refusal(scope) if door is not None else None
        if refusal is None:
            arrived = door.arrive(scope) if door is not None else None
            if arrived is None:
                super()._start_asgi_task(cycle, app)
            else:
                self._starts.add(self.loop, functools.partial(self._start, cycle, app, arrived))
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


class Starts:
    """Starts the requests that go to admission one per turn of the event loop, after the
    refusals.

    A request's first step (framework, validation, admission, the hand-over to preparation)
    is the largest piece of work the API process does for it. Started as they were read, a
    burst's admitted share ran back to back in one turn, and the refusals and probes read
    meanwhile waited for all of them. One per turn, the loop reads its sockets between them:
    what arrives is refused (or answered) at once, while the door counts the requests waiting
    here as on their way to admission. And while refusals keep coming (one within the last
    ``quiet_s``), the next start waits until ``quiet_s`` pass without one, for ``max_wait_s`` at
    most: a flood's admitted share is a few hundred requests whose first steps (and the steps
    that follow them) took about as much of the loop as the thousands of refusals read
    meanwhile, which then queued behind them; their generation takes seconds, so waiting out the
    flood costs them little. A turn without a refusal is no sign that the flood is over: new
    connections come a few at a time, and most turns between them refuse nothing.

    Nor do starts go while connections wait on the listening sockets (``watch``) to be accepted:
    uvloop accepts one connection a turn, so a turn a start makes longer holds back every
    connection behind it, refusals and probes among them, and a burst's admitted share, read
    before the door closed and before any refusal, was started turn by turn ahead of the rest of
    the burst still in the kernel's queue. Each such wait is one turn: that turn accepts one.
    """

    def __init__(
        self,
        refused: Callable[[], int] | None = None,
        max_wait_s: float = 0.25,
        quiet_s: float = 0.005,
    ) -> None:
        """``refused``: how many requests the door has refused so far (None: never wait)."""
        self._refused = refused
        self.max_wait_s = max_wait_s
        self.quiet_s = quiet_s
        self._waiting: deque[tuple[float, Callable[[], None]]] = deque()
        self._seen = 0
        self._last_refusal = -math.inf  # when a refusal was last seen (the loop's time)
        self._listening: select.poll | None = None
        self.watched: tuple[int, ...] = ()  # the listening sockets' descriptors (``watch``)

    def watch(self, listening: Iterable[int]) -> None:
        """The listening sockets (descriptors) whose queue of connections a start waits out."""
        if not hasattr(select, "poll"):  # not on Windows: starts wait for refusals only
            return
        self.watched = tuple(listening)
        poller = select.poll()
        for descriptor in self.watched:
            poller.register(descriptor, select.POLLIN)
        self._listening = poller

    def _connection_waits(self) -> bool:
        """Whether a watched socket has a connection to accept (a socket closed at shutdown,
        ``POLLNVAL``, has none)."""
        if self._listening is None:
            return False
        return any(events & select.POLLIN for _, events in self._listening.poll(0))

    def add(self, loop: asyncio.AbstractEventLoop, start: Callable[[], None]) -> None:
        self._waiting.append((loop.time(), start))
        if len(self._waiting) == 1:
            if self._refused is not None:  # what the door refused before does not hold it up
                self._seen = self._refused()
            loop.call_soon(self._next, loop)

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        queued, start = self._waiting[0]
        if self._connection_waits() and loop.time() < queued + self.max_wait_s:
            loop.call_soon(self._next, loop)  # accepted this turn, first
            return
        if self._refused is not None:
            now = loop.time()
            refused = self._refused()
            if refused != self._seen:  # refused since the last look: the flood goes on
                self._seen = refused
                self._last_refusal = now
            wait = min(self._last_refusal + self.quiet_s, queued + self.max_wait_s) - now
            if wait > 0:
                loop.call_later(wait, self._next, loop)
                return
        try:
            start()
        finally:
            self._waiting.popleft()
            if self._waiting:
                loop.call_soon(self._next, loop)


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """The most a request's head may hold (bytes of request line and headers, headers), and how
    long a client may take to send it, and between two reads of its body."""

    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
