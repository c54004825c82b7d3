"""The service's HTTP protocol: refusals at the door answered below ASGI, one write per answer."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from service.api.middleware import Door
from service.metrics import Metrics
from service.server import ServiceConfig, ServiceHttpProtocol


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


async def connection(door: Door) -> tuple[ServiceHttpProtocol, Transport, ServerState, list[str]]:
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = ServiceConfig(app, door=door, log_config=None, http=ServiceHttpProtocol)
    config.load()
    state = ServerState()
    protocol = ServiceHttpProtocol(config=config, server_state=state, app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport, state, reached


def refusing(metrics: Metrics) -> Door:
    refusal = JSONResponse({"error": {"code": "overloaded"}}, 429, {"Retry-After": "3"})
    return Door(metrics, lambda scope: refusal if scope["path"] == "/translate" else None)


async def test_a_refusal_never_becomes_an_asgi_request_and_leaves_in_one_write() -> None:
    metrics = Metrics()
    protocol, transport, state, reached = await connection(refusing(metrics))
    # Two pipelined refusals, then a request the door lets through, on one connection.
    protocol.data_received(
        request("/translate") + request("/translate", extra="X-Request-ID: r1\r\n")
    )
    await asyncio.sleep(0)  # the turn's writes leave together
    assert not state.tasks
    assert reached == []
    assert len(transport.writes) == 1  # both answers of this turn in one system call
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
