"""The floor of a flood measurement: a server that answers every request with a fixed 429.

``loadtests.overload flood`` times each request from its send to its answer on the client.
Part of that is the machine's (its network stack, the client's own work), not the service's.
This server answers each request the moment its bytes arrive, with nothing behind it: uvloop,
no HTTP parsing beyond the end of the head, ``--processes`` processes on one SO_REUSEPORT port
as the service's API processes are. The time to 429 it gets is the least the service could get
on the same machine.

    python -m loadtests.canned --port 8100 --processes 8 &
    python -m loadtests.overload --url http://127.0.0.1:8100 flood --requests 4096 --processes 8
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
from typing import cast

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


def _serve(port: int) -> None:
    import uvloop

    async def main() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(_Canned, sock=sock, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_serve, args=(args.port,)) for _ in range(args.processes)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()


if __name__ == "__main__":
    main()
