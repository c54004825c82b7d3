"""The service's HTTP protocol: refusals at the door answered below ASGI, one write per answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, cast

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from service.frontend.api.middleware import Door, OpenGate, RequestContextMiddleware
from service.frontend.doorway import Doorway, ServiceConfig
from service.frontend.metrics import Metrics
from service.frontend.protocol import HeadLimits, ServiceHttpProtocol
from service.frontend.runtime import Runtime
from service.frontend.server import DrainingServer


class Transport:
    """What a connection's transport records: the writes, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request(
    path: str, body: bytes = b'{"text": "x", "target_lang": "de"}', extra: str = ""
) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


class Server:
    """One server's config and state (as uvicorn shares them between its connections), and
    the paths its app was reached for."""

    def __init__(self, door: Door) -> None:
        self.reached: list[str] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self.reached.append(scope["path"])
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        # Behind the service's middleware, which asks the same door again.
        served = RequestContextMiddleware(app, metrics=Metrics(), max_body_bytes=1 << 20, door=door)
        self.config = ServiceConfig(served, door=door, log_config=None, http=ServiceHttpProtocol)
        self.config.load()
        self.state = ServerState()

    def connect(self) -> tuple[ServiceHttpProtocol, Transport]:
        protocol = ServiceHttpProtocol(config=self.config, server_state=self.state, app_state={})
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        return protocol, transport


async def connection(door: Door) -> tuple[ServiceHttpProtocol, Transport, ServerState, list[str]]:
    server = Server(door)
    protocol, transport = server.connect()
    return protocol, transport, server.state, server.reached


class Gate(OpenGate):
    """Refuses ``/translate`` while ``full``; counts the others as arriving."""

    def __init__(self, full: bool = True, bound: int | None = None) -> None:
        """``bound``: full (too) once this many requests are on their way."""
        self.full = full
        self.bound = bound
        self.arriving = 0
        self._refusal = JSONResponse({"error": {"code": "overloaded"}}, 429, {"Retry-After": "3"})

    def closed(self) -> bool:
        return self.full or (self.bound is not None and self.arriving >= self.bound)

    def refusal(self, scope: Scope) -> Response | None:
        return self._refusal if self.closed() and scope["path"] == "/translate" else None

    def arrive(self, scope: Scope) -> Callable[[], None] | None:
        if scope["path"] != "/translate":
            return None
        self.arriving += 1

        def arrived() -> None:
            self.arriving -= 1

        return arrived

    def route(self, scope: Scope) -> str:
        return str(scope["path"])


def refusing(metrics: Metrics) -> Door:
    return Door(metrics, Gate())


async def test_a_refusal_never_becomes_an_asgi_request_and_leaves_in_one_write() -> None:
    metrics = Metrics()
    protocol, transport, state, reached = await connection(refusing(metrics))
    # Two pipelined refusals, then a request the door lets through, on one connection.
    protocol.data_received(
        request("/translate") + request("/translate", extra="X-Request-ID: r1\r\n")
    )
    # Both answers left at once, in one system call: not at the end of the loop's turn,
    # behind whatever else the turn runs.
    assert len(transport.writes) == 1
    await asyncio.sleep(0)
    assert not state.tasks
    assert reached == []
    assert len(transport.writes) == 1
    answers = transport.writes[0].split(b"HTTP/1.1 ")[1:]
    assert [answer.split(b"\r\n")[0] for answer in answers] == [b"429 Too Many Requests"] * 2
    assert b"retry-after: 3\r\n" in answers[0]
    assert b"x-request-id: r1\r\n" in answers[1]
    assert answers[0].endswith(b'\r\n\r\n{"error":{"code":"overloaded"}}')
    assert not transport.closed  # kept alive, the refused bodies skipped
    protocol.data_received(request("/other"))
    await asyncio.sleep(0.01)
    assert reached == ["/other"]
    assert transport.writes[-1].startswith(b"HTTP/1.1 200 OK")
    exposition = metrics.render().decode()
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 2.0' in exposition


async def test_a_refused_request_asking_to_close_gets_its_answer_then_the_close() -> None:
    protocol, transport, _, _ = await connection(refusing(Metrics()))
    protocol.data_received(request("/translate", extra="Connection: close\r\n"))
    await asyncio.sleep(0)
    assert transport.closed
    assert b"connection: close\r\n" in transport.writes[0]
    assert transport.writes[0].startswith(b"HTTP/1.1 429 ")


async def test_a_refusal_split_over_reads_is_left_to_the_parser_and_still_refused() -> None:
    metrics = Metrics()
    protocol, transport, state, reached = await connection(refusing(metrics))
    whole = request("/translate", extra="X-Request-ID: split\r\n")
    protocol.data_received(whole[:20])  # head not yet all here
    protocol.data_received(whole[20:-5])  # body not yet all here
    protocol.data_received(whole[-5:])
    await asyncio.sleep(0)
    assert reached == []
    assert not state.tasks
    (answer,) = transport.writes
    assert answer.startswith(b"HTTP/1.1 429 ")
    assert b"x-request-id: split\r\n" in answer
    # The connection goes on at the next request's first byte.
    protocol.data_received(request("/translate"))
    await asyncio.sleep(0)
    assert len(transport.writes) == 2
    assert transport.writes[1].startswith(b"HTTP/1.1 429 ")
    exposition = metrics.render().decode()
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 2.0' in exposition


async def test_refusals_then_a_request_let_in_are_answered_in_order() -> None:
    protocol, transport, _, reached = await connection(refusing(Metrics()))
    protocol.data_received(request("/translate") + request("/other") + request("/translate"))
    await asyncio.sleep(0.01)
    assert reached == ["/other"]
    statuses = [w.split(b"\r\n")[0] for w in b"".join(transport.writes).split(b"HTTP/1.1 ")[1:]]
    assert statuses == [b"429 Too Many Requests", b"200 OK", b"429 Too Many Requests"]


async def test_framing_the_door_does_not_read_itself_goes_through_the_parser() -> None:
    protocol, transport, _, _ = await connection(refusing(Metrics()))
    chunked = (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    protocol.data_received(chunked + request("/translate"))
    await asyncio.sleep(0)
    answers = b"".join(transport.writes).split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n")[0] for a in answers] == [b"429 Too Many Requests"] * 2
    assert not transport.closed


async def test_a_malformed_head_gets_the_parsers_400_not_a_refusal() -> None:
    protocol, transport, _, _ = await connection(refusing(Metrics()))
    protocol.data_received(b"POST /translate HTTP/1.1\r\nno colon\r\nContent-Length: 0\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.writes[0].startswith(b"HTTP/1.1 400 ")
    assert transport.closed


async def test_a_connection_idle_after_refusals_is_closed_at_the_keep_alive_timeout() -> None:
    protocol, transport, _, _ = await connection(refusing(Metrics()))
    protocol.timeout_keep_alive = 0.05  # type: ignore[assignment]
    protocol.data_received(request("/translate"))
    assert protocol.timeout_keep_alive_task is not None
    await asyncio.sleep(0.02)
    assert not transport.closed
    await asyncio.sleep(0.1)
    assert transport.closed


async def test_an_open_door_leaves_every_request_to_the_app() -> None:
    protocol, transport, _, reached = await connection(Door(Metrics(), OpenGate()))
    protocol.data_received(request("/translate"))
    await asyncio.sleep(0.01)
    assert reached == ["/translate"]
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_requests_for_admission_start_one_per_turn_counted_as_arriving_until_then() -> None:
    gate = Gate(full=False)
    server = Server(Door(Metrics(), gate))
    connections = [server.connect()[0] for _ in range(4)]
    for protocol in connections[:3]:
        protocol.data_received(request("/translate"))
    assert gate.arriving == 3  # read, none started: the door counts all three
    connections[3].data_received(request("/health"))  # not for admission: not held back
    turns: list[list[str]] = []
    for _ in range(4):
        await asyncio.sleep(0)
        turns.append(list(server.reached))
    # A start takes two turns (started in one, its first step in the next), one start a turn.
    assert turns == [
        ["/health"],
        ["/health", "/translate"],
        ["/health", "/translate", "/translate"],
        ["/health", "/translate", "/translate", "/translate"],
    ]
    await asyncio.sleep(0.01)
    assert gate.arriving == 0


async def test_while_refusals_keep_coming_the_admitted_wait_for_a_quiet_spell() -> None:
    """A flood's admitted share started one per turn still took as much of the loop as the
    refusals read meanwhile, which queued behind them: starts wait for a spell without one."""
    gate = Gate(full=False, bound=2)
    server = Server(Door(Metrics(), gate))
    starts = server.config.admitting_starts
    starts.quiet_s = 0.01
    admitted = [server.connect()[0] for _ in range(2)]
    for protocol in admitted:
        protocol.data_received(request("/translate"))
    assert gate.closed()  # both on their way: the door is closed for the rest
    flood = [server.connect() for _ in range(4)]
    for protocol, transport in flood:  # a refusal read in each turn
        protocol.data_received(request("/translate"))
        assert transport.writes[0].startswith(b"HTTP/1.1 429 ")
        await asyncio.sleep(0)
        assert server.reached == []
    await asyncio.sleep(0.05)  # quiet since: one start a turn again
    assert server.reached == ["/translate", "/translate"]


async def test_refusals_a_few_turns_apart_still_hold_the_admitted_back() -> None:
    # New connections come a few at a time: most turns of a flood refuse nothing, and a start
    # in each of them put the admitted share's work back among the refusals.
    gate = Gate(full=False, bound=1)
    server = Server(Door(Metrics(), gate))
    starts = server.config.admitting_starts
    starts.quiet_s, starts.max_wait_s = 0.02, 5.0
    loop = asyncio.get_running_loop()
    server.connect()[0].data_received(request("/translate"))
    for _ in range(10):  # a refusal every 5 ms, each followed by turns without one
        server.connect()[0].data_received(request("/translate"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert server.reached == []
        await asyncio.sleep(0.005)
    last = loop.time()
    while not server.reached:
        await asyncio.sleep(0.001)
        assert loop.time() - last < 1
    assert loop.time() - last >= 0.015  # once the refusals had stopped for the quiet spell


async def test_a_start_waits_for_refusals_no_longer_than_its_bound() -> None:
    gate = Gate(full=False, bound=1)
    server = Server(Door(Metrics(), gate))
    server.config.admitting_starts.max_wait_s = 0.02
    loop = asyncio.get_running_loop()
    server.connect()[0].data_received(request("/translate"))
    turns = 0

    def refuse_one_a_turn() -> None:  # a refusal in every turn of the loop, for ever
        nonlocal turns
        turns += 1
        server.connect()[0].data_received(request("/translate"))
        if not server.reached:
            loop.call_soon(refuse_one_a_turn)

    started = loop.time()
    refuse_one_a_turn()
    while not server.reached:
        await asyncio.sleep(0.001)
        assert loop.time() - started < 1
    assert loop.time() - started >= 0.02
    assert turns > 10


async def test_no_start_while_connections_wait_to_be_accepted() -> None:
    """uvloop accepts one connection a turn: a burst's admitted share, started turn by turn
    before the door closed, held the rest of the burst in the kernel's queue (refusals after
    tens of milliseconds). Starts wait while a listening socket has a connection to accept."""
    gate = Gate(full=False)
    server = Server(Door(Metrics(), gate))
    starts = server.config.admitting_starts
    starts.max_wait_s = 5.0
    with socket.create_server(("127.0.0.1", 0)) as listening:
        starts.watch([listening.fileno()])
        assert starts.watched == (listening.fileno(),)
        with socket.create_connection(listening.getsockname()):  # queued, not yet accepted
            server.connect()[0].data_received(request("/translate"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert server.reached == []
            accepted, _ = listening.accept()
            with accepted:
                for _ in range(3):
                    await asyncio.sleep(0)
                assert server.reached == ["/translate"]


async def test_a_closed_listening_socket_holds_no_start_back() -> None:
    # At shutdown the server closes its sockets: a start then goes at once, not after its bound.
    gate = Gate(full=False)
    server = Server(Door(Metrics(), gate))
    starts = server.config.admitting_starts
    starts.max_wait_s = 5.0
    listening = socket.create_server(("127.0.0.1", 0))
    starts.watch([listening.fileno()])
    listening.close()
    server.connect()[0].data_received(request("/translate"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert server.reached == ["/translate"]


async def test_the_server_has_its_starts_watch_the_sockets_it_listens_on() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

    config = ServiceConfig(app, door=Door(Metrics()), log_config=None, http=Doorway)
    server = DrainingServer(config, cast(Runtime, None), 1.0, signals=())
    with socket.create_server(("127.0.0.1", 0)) as listening:
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        while not server.started:
            assert not serving.done()
            await asyncio.sleep(0.01)
        assert config.admitting_starts.watched == (listening.fileno(),)
        server.should_exit = True
        await serving


async def test_a_start_waits_for_the_accept_queue_no_longer_than_its_bound() -> None:
    gate = Gate(full=False)
    server = Server(Door(Metrics(), gate))
    starts = server.config.admitting_starts
    starts.max_wait_s = 0.02
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listening:
        starts.watch([listening.fileno()])
        with socket.create_connection(listening.getsockname()):  # never accepted
            began = loop.time()
            server.connect()[0].data_received(request("/translate"))
            while not server.reached:
                await asyncio.sleep(0.001)
                assert loop.time() - began < 1
            assert loop.time() - began >= 0.02


async def test_a_request_on_its_way_is_not_refused_for_counting_itself() -> None:
    # Room for one: the request counts as on its way until it starts, then reaches the app.
    protocol, transport, _, reached = await connection(Door(Metrics(), Gate(False, bound=1)))
    protocol.data_received(request("/translate"))
    await asyncio.sleep(0.01)
    assert reached == ["/translate"]
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_a_head_over_the_byte_limit_is_431_before_it_is_all_read() -> None:
    server = Server(Door(Metrics(), OpenGate()))
    server.config.head_limits = HeadLimits(max_header_bytes=4096, max_headers=100)
    protocol, transport = server.connect()
    protocol.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
    for _ in range(3):
        protocol.data_received(b"a" * 2000)  # a header that never ends
    assert transport.closed
    answer = transport.writes[-1]
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"content-type: application/json" in answer
    assert b'"headers_too_large"' in answer
    assert server.reached == []


async def test_too_many_headers_is_431_and_a_big_body_is_not() -> None:
    server = Server(Door(Metrics(), OpenGate()))
    server.config.head_limits = HeadLimits(max_header_bytes=4096, max_headers=20)
    protocol, transport = server.connect()
    headers = "".join(f"X-{index}: v\r\n" for index in range(21))
    protocol.data_received(f"GET /health HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    assert transport.writes[-1].startswith(b"HTTP/1.1 431 ")
    protocol, transport = server.connect()
    protocol.data_received(request("/translate", body=b"x" * 50_000))  # the head is small
    await asyncio.sleep(0.01)
    assert server.reached == ["/translate"]
    assert transport.writes[0].startswith(b"HTTP/1.1 200 ")


async def test_a_request_that_is_not_http_gets_a_json_400() -> None:
    protocol, transport, _, reached = await connection(Door(Metrics(), OpenGate()))
    protocol.data_received(b"\x16\x03\x01 not http at all\r\n\r\n")
    answer = transport.writes[-1]
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/json" in answer
    assert answer.endswith(b'{"error": {"code": "bad_request", "message": "invalid HTTP request"}}')
    assert transport.closed
    assert reached == []


async def test_a_head_over_the_byte_limit_read_in_one_piece_is_431() -> None:
    """Issue 34, finding 7: a head between the limit and twice it, in one read, passed."""
    server = Server(Door(Metrics(), OpenGate()))
    server.config.head_limits = HeadLimits(max_header_bytes=4096, max_headers=100)
    protocol, transport = server.connect()
    protocol.data_received(
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 6000 + b"\r\n\r\n"
    )
    assert transport.writes[-1].startswith(b"HTTP/1.1 431 ")
    assert transport.closed
    assert server.reached == []


async def test_a_head_or_a_body_sent_too_slowly_is_408_and_closed() -> None:
    """Issue 34, finding 7: a client sending a byte now and then held its connection for ever."""
    server = Server(Door(Metrics(), OpenGate()))
    server.config.head_limits = HeadLimits(head_timeout_s=0.2, body_timeout_s=0.2)
    protocol, transport = server.connect()
    for byte in b"GET /hea":  # a byte every 50 ms: never 200 ms apart, but the head takes long
        protocol.data_received(bytes([byte]))
        await asyncio.sleep(0.05)
    assert transport.closed
    assert transport.writes[-1].startswith(b"HTTP/1.1 408 ")
    protocol, transport = server.connect()
    protocol.data_received(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
    await asyncio.sleep(0.3)  # the rest of the body never comes
    assert transport.closed
    assert transport.writes[-1].startswith(b"HTTP/1.1 408 ")
    assert b'"request_timeout"' in transport.writes[-1]
    # A request sent at once is answered, and its connection then idles under keep-alive.
    protocol, transport = server.connect()
    protocol.data_received(request("/translate"))
    await asyncio.sleep(0.3)
    assert transport.writes[0].startswith(b"HTTP/1.1 200 ")
    assert not transport.closed


async def test_a_head_begun_while_the_last_answer_was_pending_is_timed_from_that_answer() -> None:
    """A slow answer is not the client's delay (no 408 over it); the next head's is, once the
    answer has gone."""
    answer = asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = ServiceConfig(
        slow, door=Door(Metrics(), OpenGate()), log_config=None, http=ServiceHttpProtocol
    )
    config.load()
    config.head_limits = HeadLimits(head_timeout_s=0.2, body_timeout_s=0.2)
    protocol = ServiceHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request("/translate") + b"GET /hea")  # the next head, begun
    await asyncio.sleep(0.4)
    assert not transport.closed  # the answer is still being worked on
    answer.set()
    await asyncio.sleep(0.05)
    assert b"HTTP/1.1 200 " in b"".join(transport.writes)
    assert not transport.closed
    await asyncio.sleep(0.3)
    assert transport.closed
    assert transport.writes[-1].startswith(b"HTTP/1.1 408 ")
