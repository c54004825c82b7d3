"""The framework's routing state, built at start instead of by the first request.

FastAPI builds each router's matching state (every route's dependencies, body fields and
validators) lazily, the first time a request is matched against that router, under a lock, on
the event loop. The first request an API process served paid for its whole router, tens of
milliseconds (docs/benchmarks.md), and a burst right after a start (or a restart under load)
found every process's loop stopped that long once per dialect, refusals and probes waiting
behind it. ``build_routing_state`` sends
one request that no route matches through each router, the service's and each mounted
dialect's, before uvicorn listens: matching it walks, and so builds, every route. The requests go
to the routers themselves, past the middleware: nothing is counted, logged or charged.
"""

from __future__ import annotations

from collections.abc import Iterator

from starlette.routing import Mount, Router
from starlette.types import ASGIApp, Message, Scope

# A path no route has: a NUL, which no client's request line can carry.
_NOWHERE = "/\x00"


def _routers(app: ASGIApp) -> Iterator[Router]:
    """The app's router and those of the apps mounted on it, depth first."""
    router = getattr(app, "router", None)
    if not isinstance(router, Router):
        return
    yield router
    for route in router.routes:
        if isinstance(route, Mount):
            yield from _routers(route.app)


async def build_routing_state(app: ASGIApp) -> None:
    """Match a request for a path no route has, once for each method the routes take, against
    every router of ``app``."""
    for router in _routers(app):
        for method in ("GET", "POST"):
            await router(_scope(method), _receive, _discard)


def _scope(method: str) -> Scope:
    # No "app" key: a router that matches nothing then answers 404 itself, where with one it
    # would raise for the app's exception handlers.
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": _NOWHERE,
        "raw_path": b"/%00",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(message: Message) -> None:
    pass
