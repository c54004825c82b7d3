"""The doorway: a connection's first protocol, refusing from raw bytes and handing anything else,
with its bytes, to the service's HTTP protocol."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import uvicorn
from hypothesis import example, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from loadtests.stack import free_port
from service.frontend.api.middleware import Door
from service.frontend.doorway import Deadlines, Doorway, ServiceConfig
from service.frontend.metrics import Metrics
from service.frontend.protocol import HeadLimits, ServiceHttpProtocol
from tests.api.test_protocol import Gate, Server, Transport, refusing, request


class SwitchingTransport(Transport):
    """A transport whose protocol can be changed, as uvloop's and asyncio's can."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol

    def feed(self, data: bytes) -> None:
        self.protocol.data_received(data)


def open_doorway(server: Server) -> tuple[Doorway, SwitchingTransport]:
    doorway = Doorway(server.config, server.state, {})
    transport = SwitchingTransport()
    transport.set_protocol(doorway)
    doorway.connection_made(transport)  # type: ignore[arg-type]
    return doorway, transport


def held(server: Server) -> set[object]:
    """The connections uvicorn's server state counts (those a shutdown closes)."""
    return set(server.state.connections)


def held_by(state: ServerState) -> list[Any]:
    return list(state.connections)


def statuses(transport: Transport) -> list[bytes]:
    answers = b"".join(transport.writes).split(b"HTTP/1.1 ")[1:]
    return [answer.split(b" ", 1)[0] for answer in answers]


async def test_refusals_never_build_the_http_protocol_and_leave_in_one_write() -> None:
    metrics = Metrics()
    server = Server(refusing(metrics))
    doorway, transport = open_doorway(server)
    assert doorway in held(server)  # closed by a shutdown like uvicorn's own
    transport.feed(request("/translate") + request("/translate", extra="X-Request-ID: r7\r\n"))
    assert transport.protocol is doorway
    assert len(transport.writes) == 1
    assert statuses(transport) == [b"429", b"429"]
    assert b"x-request-id: r7\r\n" in transport.writes[0]
    assert b"retry-after: 3\r\n" in transport.writes[0]
    assert server.state.total_requests == 2
    assert not transport.closed
    exposition = metrics.render().decode()
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 2.0' in exposition
    # The next request the door lets in: handed over, with its bytes, and answered by the app.
    transport.feed(request("/other"))
    assert isinstance(transport.protocol, ServiceHttpProtocol)
    assert doorway not in held(server)
    assert transport.protocol in held(server)
    await asyncio.sleep(0.01)
    assert server.reached == ["/other"]
    assert statuses(transport) == [b"429", b"429", b"200"]


async def test_a_request_let_in_waits_at_the_doorway_for_its_turn_counted_as_on_its_way() -> None:
    """Handing a connection over (uvicorn's protocol built, the request parsed) stood in front of
    every refusal read after it in the same turn: a flood's admitted share is read first."""
    gate = Gate(full=False, bound=1)
    server = Server(Door(Metrics(), gate))
    doorway, transport = open_doorway(server)
    transport.feed(request("/translate"))
    assert transport.protocol is doorway  # not handed over yet
    assert gate.arriving == 1  # but counted: the door is full of it
    assert not transport.reading
    _, refused = open_doorway(server)
    refused.feed(request("/translate"))
    assert statuses(refused) == [b"429"]  # refused at once, in the same turn
    await asyncio.sleep(0.01)
    # Its turn came: handed over, and not refused for the door it fills itself.
    assert isinstance(transport.protocol, ServiceHttpProtocol)
    assert transport.reading
    assert server.reached == ["/translate"]
    assert statuses(transport) == [b"200"]
    assert gate.arriving == 0


async def test_a_client_that_leaves_before_its_turn_is_no_longer_on_its_way() -> None:
    gate = Gate(full=False, bound=1)
    server = Server(Door(Metrics(), gate))
    doorway, transport = open_doorway(server)
    transport.feed(request("/translate"))
    assert gate.arriving == 1
    transport.close()
    doorway.connection_lost(None)
    await asyncio.sleep(0.01)
    assert gate.arriving == 0
    assert server.reached == []
    assert transport.protocol is doorway


async def test_a_connection_that_sends_nothing_is_closed_after_a_heads_time() -> None:
    """A connection opened and left silent held a socket for ever (uvicorn times nothing before
    the first byte)."""
    server = Server(refusing(Metrics()))
    server.config.head_limits = HeadLimits(head_timeout_s=0.05)
    server.config.deadlines = Deadlines(period_s=0.01)
    doorway, transport = open_doorway(server)
    await asyncio.sleep(0.02)
    assert not transport.closed
    await asyncio.sleep(0.1)
    assert transport.closed
    assert transport.writes == []
    doorway.connection_lost(None)
    assert doorway not in held(server)


async def test_a_connection_idle_after_refusals_is_closed_at_the_keep_alive_timeout() -> None:
    server = Server(refusing(Metrics()))
    server.config.head_limits = HeadLimits(head_timeout_s=0.05)
    server.config.timeout_keep_alive = 0.2  # type: ignore[assignment]
    server.config.deadlines = Deadlines(period_s=0.01)
    _, transport = open_doorway(server)
    await asyncio.sleep(0.02)
    transport.feed(request("/translate"))  # the head's timer is replaced by keep-alive's
    await asyncio.sleep(0.1)
    assert not transport.closed
    await asyncio.sleep(0.2)
    assert transport.closed


async def test_shutdown_closes_a_connection_still_at_the_doorway() -> None:
    server = Server(refusing(Metrics()))
    doorway, transport = open_doorway(server)
    for connection in list(server.state.connections):
        connection.shutdown()
    assert transport.closed
    doorway.connection_lost(None)
    assert not server.state.connections


# What a client may send on one connection: refused translations (plain, or framed in ways the
# doorway leaves to the parser), requests the door lets in, and a malformed head (which ends
# the connection with a 400).
_REQUESTS = {
    "refused": (request("/translate"), b"429"),
    "refused-id": (request("/translate", extra="X-Request-ID: abc\r\n"), b"429"),
    "let-in": (request("/other"), b"200"),
    "probe": (b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
    "chunked": (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        b"429",
    ),
    "queried": (request("/translate?x=1"), b"429"),
    "malformed": (b"POST /translate HTTP/1.1\r\nno colon\r\nContent-Length: 0\r\n\r\n", b"400"),
}


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.sampled_from(sorted(_REQUESTS)), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6),
    full=st.booleans(),
)
def test_any_requests_split_anyhow_get_the_answers_the_http_protocol_gives(
    names: list[str], cuts: list[int], full: bool
) -> None:
    """Through the doorway or straight to the HTTP protocol, the same requests in the same
    reads get the same answers in the same order, and the app sees the same requests."""
    if "malformed" in names:  # nothing after a malformed head is read
        names = names[: names.index("malformed") + 1]
    data = b"".join(_REQUESTS[name][0] for name in names)
    reads, start = [], 0
    for cut in sorted(set(cuts)):
        if start < cut < len(data):
            reads.append(data[start:cut])
            start = cut
    reads.append(data[start:])

    async def answers(through_doorway: bool) -> tuple[list[bytes], list[str], bool]:
        server = Server(Door(Metrics(), Gate(full=full)))
        transport: Transport
        if through_doorway:
            _, switching = open_doorway(server)
            transport, feed = switching, switching.feed
        else:
            protocol, transport = server.connect()
            feed = protocol.data_received
        for chunk in reads:
            if transport.closed:
                break
            feed(chunk)
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.01)
        return statuses(transport), server.reached, transport.closed

    direct = asyncio.run(answers(False))
    through = asyncio.run(answers(True))
    assert through == direct
    expected = [
        b"200" if not full and status == b"429" else status
        for status in (_REQUESTS[name][1] for name in names)
    ]
    if names[-1] == "malformed":  # the parser's 400 ends the connection: requests read with
        # the malformed head but not yet answered go unanswered, through either path
        assert through[0][-1] == b"400"
        assert through[2]
    else:
        assert through[0] == expected


@pytest.mark.parametrize("handed_over", [False, True])
async def test_a_client_that_never_reads_its_refusals_stops_being_read(handed_over: bool) -> None:
    """A client pipelining refused requests without reading the answers had the server buffer
    every answer: memory without bound. Once the answers back up, the connection is no longer
    read (TCP then holds the client back), at the doorway and after it."""
    server = Server(refusing(Metrics()))
    port = free_port()
    config = ServiceConfig(
        cast(ASGIApp, server.config.app), door=server.config.door, host="127.0.0.1", port=port,
        log_config=None, http=Doorway, timeout_keep_alive=60,
    )  # fmt: skip
    uvicorn_server = uvicorn.Server(config)
    serving = asyncio.create_task(uvicorn_server.serve())
    for _ in range(500):
        if uvicorn_server.started:
            break
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if handed_over:  # a request let in first: the HTTP protocol holds the connection
        writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"ok")
    burst = request("/translate") * 1000  # about 100 kB of requests, 300 kB of answers
    largest, stalled = 0, False
    try:
        for _ in range(200):  # 20 MB, unless the server stops reading first
            writer.write(burst)
            try:
                await asyncio.wait_for(asyncio.shield(writer.drain()), 0.5)
            except TimeoutError:
                stalled = True  # the server stopped reading: the client's buffers are full
                break
            for connection in held_by(uvicorn_server.server_state):
                transport: Any = getattr(connection, "transport", None) or connection._transport
                largest = max(largest, transport.get_write_buffer_size())
        assert stalled
        # Once the client reads its answers, the server reads again: the rest goes through.
        answers = asyncio.create_task(reader.read(-1))
        await asyncio.wait_for(writer.drain(), 30)
        answers.cancel()
    finally:
        writer.transport.abort()
        uvicorn_server.should_exit = True
        await serving
    assert largest < 4 * 2**20


_HEAD_PARTS = st.sampled_from(
    [b"POST ", b"/translate", b" HTTP/1.1", b"\r\n", b"Content-Length: ", b"X-Request-ID: ",
     b"Transfer-Encoding: chunked", b": ", b"9" * 5000, b"\xff\xfe", b"/\xc3\xa9", b"0", b"12",
     b" ", b"\t", b"\r\n\r\n", b"%2F", b"?q=1", b"x" * 300]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@example(data=b"POST /translate HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
@example(data=b"POST /tr\xffnslate HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
@given(
    data=st.one_of(
        st.binary(max_size=600),
        st.lists(_HEAD_PARTS, max_size=14).map(b"".join),
    )
)
def test_any_bytes_at_the_doorway_are_refused_answered_or_handed_over_never_raise(
    data: bytes,
) -> None:
    """Issue 1's attacker, at the first bytes: a Content-Length of 5,000 digits (past Python's
    int conversion limit) or a path that is not ASCII raised inside the protocol."""

    async def feed(through_doorway: bool) -> list[bytes]:
        server = Server(refusing(Metrics()))
        if through_doorway:
            _, switching = open_doorway(server)
            switching.feed(data)
            transport: Transport = switching
        else:  # the HTTP protocol's own fast path, on a connection it already holds
            protocol, transport = server.connect()
            protocol.data_received(data)
        await asyncio.sleep(0.002)
        return statuses(transport)

    answered = asyncio.run(feed(True)) + asyncio.run(feed(False))
    assert all(
        status in (b"200", b"400", b"404", b"405", b"413", b"429", b"431") for status in answered
    )
