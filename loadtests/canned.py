"""The floor of a flood measurement: a server that answers every request with a fixed 429.

``loadtests.overload flood`` times each request from its send to its answer on the client.
Part of that is the machine's (its network stack, the client's own work), not the service's.
This server answers each request the moment its bytes arrive, with nothing behind it: uvloop,
no HTTP parsing beyond the end of the head, ``--processes`` processes on one SO_REUSEPORT port
as the service's API processes are. The time to 429 it gets is the least the service could get
on the same machine.

    python -m loadtests.canned --port 8100 --processes 8 &
    python -m loadtests.overload --url http://127.0.0.1:8100 flood --requests 4096 --processes 8

``--doorway`` serves the same refusals through the service's own front door instead: uvicorn's
server with the service's doorway (``service.frontend.doorway``) and a door that is always shut,
nothing behind it (``/health`` and any other path not refused get 200). Between the raw
responder's figure and the service's, it tells the cost of the front door itself from the cost
of what the service does behind it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import signal
import socket
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

_BODY = b'{"error": {"code": "overloaded", "message": "full, canned."}}'
_ANSWER = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    + f"content-length: {len(_BODY)}\r\n\r\n".encode()
    + _BODY
)


class _Canned(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        # One answer per request head; bodies are small and come with it, so they are skipped.
        self._buffer += data
        while b"\r\n\r\n" in self._buffer:
            head, _, rest = self._buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self._buffer = rest[length:]
            self._transport.write(_ANSWER)


def _shared_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _serve(port: int) -> None:
    import uvloop

    async def main() -> None:
        sock = _shared_socket(port)
        server = await asyncio.get_running_loop().create_server(_Canned, sock=sock, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


class _Shut:
    """A door's gate that refuses every translation with the canned answer."""

    def __init__(self) -> None:
        from starlette.responses import Response

        self._answer = Response(_BODY, 429, {"retry-after": "1"}, "application/json")

    def closed(self) -> bool:
        return True

    def refusal(self, scope: Scope) -> Response | None:
        return self._answer if scope["method"] == "POST" else None

    def arrive(self, scope: Scope) -> None:
        return None

    def route(self, scope: Scope) -> str:
        return "/translate"


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _serve_doorway(port: int) -> None:
    import uvicorn

    from service.frontend.api.middleware import Door
    from service.frontend.doorway import Doorway, ServiceConfig
    from service.frontend.metrics import Metrics

    door = Door(Metrics(), _Shut())
    config = ServiceConfig(
        _ok, door=door, http=Doorway, backlog=4096, log_config=None, access_log=False
    )
    uvicorn.Server(config).run(sockets=[_shared_socket(port)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument(
        "--doorway", action="store_true", help="answer through the service's doorway instead"
    )
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    target = _serve_doorway if args.doorway else _serve
    processes = [context.Process(target=target, args=(args.port,)) for _ in range(args.processes)]
    # Stopped (SIGTERM, as a script's kill sends), the servers stop with it: left running, they
    # would hold the port and a core each.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join()
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)


if __name__ == "__main__":
    main()
