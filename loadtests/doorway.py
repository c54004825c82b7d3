"""CPU a connection costs at the service's front door, without a network: what a flood's
refusals and its admitted share take of an API process's event loop, beside the raw responder's
floor (``loadtests.canned``).

Each connection is the doorway's (``service.frontend.doorway``) with a transport that only
records, given one request whole, as a flood's clients send them:

- ``refusal_us``: a refused request, the connection's opening and closing included;
- ``admitted_us``: a request the door lets in for admission, until its start is queued (what is
  done in the turn that read it, ahead of every refusal read after it);
- ``canned_us``: the canned responder's refusal, the floor;
- ``admission_refusal_us``: a refused request as the service refuses it, its door asking the
  service's own admission (full) for the refusal in the native dialect.

    python -m loadtests.doorway --connections 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar, cast

from starlette.responses import Response
from starlette.types import Scope
from uvicorn.server import ServerState

from loadtests.canned import _Canned, _ok, _Shut
from service.frontend.api.middleware import Door
from service.frontend.app import AdmissionGate
from service.frontend.doorway import Doorway, ServiceConfig
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission
from service.frontend.runtime import Runtime

_BODY = b'{"text": "Hello there, how are you?", "target_lang": "de"}'
REQUEST = (
    b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_BODY)}\r\n\r\n".encode()
    + _BODY
)


class _Transport:
    """Records nothing and answers what uvicorn's protocol asks of a TCP transport."""

    _EXTRA: ClassVar[dict[str, tuple[str, int]]] = {
        "sockname": ("127.0.0.1", 8000),
        "peername": ("127.0.0.1", 50000),
    }

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: object) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._EXTRA.get(name, default)


class _LetIn:
    """A door that lets every translation in, counted as on its way."""

    def __init__(self, connections: int) -> None:
        self._left = connections
        self.all_released = asyncio.Event()  # every one no longer on its way

    def _release(self) -> None:
        self._left -= 1
        if self._left == 0:
            self.all_released.set()

    def closed(self) -> bool:
        return False

    def refusal(self, scope: Scope) -> Response | None:
        return None

    def arrive(self, scope: Scope) -> Callable[[], None] | None:
        return self._release

    def route(self, scope: Scope) -> str:
        return "/translate"


def _full_admission() -> AdmissionGate:
    """The service's own gate over an admission with no room (one text on its way, of one)."""
    admission = Admission(1, Metrics(), lambda: None)
    admission.arrive()
    return AdmissionGate(cast(Runtime, SimpleNamespace(admission=admission)))


def _config(gate: _Shut | _LetIn | AdmissionGate) -> ServiceConfig:
    config = ServiceConfig(
        _ok, door=Door(Metrics(), gate), http=Doorway, log_config=None, access_log=False
    )
    config.load()
    return config


def _connect(
    config: ServiceConfig, loop: asyncio.AbstractEventLoop, connections: int, close: bool
) -> tuple[float, list[Doorway]]:
    """µs of CPU a connection given ``REQUEST`` costs at the doorway, closed after it (a
    refusal) or kept (an admitted request waits for its turn, as the server keeps it)."""
    transport: Any = _Transport()
    state = ServerState()
    kept = []
    started = time.process_time()
    for _ in range(connections):
        doorway = Doorway(config, state, {}, loop)
        doorway.connection_made(transport)
        doorway.data_received(REQUEST)
        if close:
            doorway.connection_lost(None)
        else:
            kept.append(doorway)
    return round((time.process_time() - started) / connections * 1e6, 2), kept


async def measure(connections: int) -> dict[str, float]:
    """µs of CPU per connection: refused, admitted, refused by a full admission, and the
    canned responder's."""
    loop = asyncio.get_running_loop()
    figures: dict[str, float] = {"connections": connections}
    figures["refusal_us"], _ = _connect(_config(_Shut()), loop, connections, close=True)
    letting_in = _LetIn(connections)
    figures["admitted_us"], kept = _connect(_config(letting_in), loop, connections, close=False)
    for doorway in kept:  # gone before their turn: each turn lets one go, nothing started
        doorway.connection_lost(None)
    await letting_in.all_released.wait()
    figures["admission_refusal_us"], _ = _connect(
        _config(_full_admission()), loop, connections, close=True
    )
    transport: Any = _Transport()
    started = time.process_time()
    for _ in range(connections):
        canned = _Canned()
        canned.connection_made(transport)
        canned.data_received(REQUEST)
    figures["canned_us"] = round((time.process_time() - started) / connections * 1e6, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=20_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.connections)), indent=2))


if __name__ == "__main__":
    main()
