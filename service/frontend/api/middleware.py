"""HTTP plumbing every request goes through, as one pure ASGI middleware.

- Request ids: the client's ``X-Request-ID`` when it is sane, else a new one; echoed on every
  response and put on every log line of the request.
- Refusal before the body: while admission is full, a translation request is answered 429 in
  its dialect's shape before its body is read or parsed (``refuse``), the cheapest answer there
  is when thousands arrive at once.
- Body limit: a body over ``max_body_bytes`` is answered 413 before the route parses it, whether
  the client declared its length or streamed it chunked.
- Metrics and access log: count and latency by route template (not raw path: bounded labels),
  one structured log line per request, never the request's texts. Refusals at the door are
  counted in the metrics one by one but logged as one line a second (``Door``): under a
  flood the log line was a large share of what each refusal cost, and a line with the count
  says more than thousands of identical ones.
- Disconnects: a client that goes away before its answer cancels its request (status 499 in
  logs and metrics), so its queued texts are dropped before they reach the model.
- Response headers every answer carries unless its route set its own: ``X-Content-Type-Options:
  nosniff``, ``X-Frame-Options: DENY`` and ``Content-Security-Policy: frame-ancestors 'none'``
  (no answer of this service is meant to be sniffed into a page or framed), and
  ``Cache-Control: no-store`` (an answer no route marked cacheable is not kept by any cache:
  keyed answers, documents, usage).
- Lone surrogates: a JSON body holding a string that is not valid Unicode is answered 4xx in
  its route's dialect before any route sees it (``service.frontend.api.surrogates``).
- Last resort: an exception no handler took becomes a 500 in the one error shape.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from fastapi.telemetry import TelemetryConfig
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.contract.errors import (
    InvalidInput,
    PayloadTooLarge,
    ServiceError,
    UnsupportedEncoding,
)
from service.frontend.api.errors import NATIVE, Dialect
from service.frontend.api.surrogates import lone_surrogate
from service.frontend.metrics import Children, Metrics

log = logging.getLogger("service.frontend.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Headers added to every response that does not set them itself (see the module's docstring).
_DEFAULT_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"cache-control", b"no-store"),
)


class Gate(Protocol):
    """What the door asks of the app: whether it may refuse now, what it refuses, and which
    requests are on their way to admission."""

    def closed(self) -> bool:
        """Whether ``refusal`` may refuse anything now (the cheap check, asked first)."""
        ...

    def refusal(self, scope: Scope) -> Response | None:
        """The answer for a request refused before its body is read, or None."""
        ...

    def arrive(self, scope: Scope) -> Callable[[], None] | None:
        """For a request that will ask admission for texts: count it as on its way (the door
        closes for it as for an admitted one) until the returned callable is called."""
        ...

    def route(self, scope: Scope) -> str:
        """The route template a refused request is counted under (never the path itself: a
        client chooses paths, and each new label value is a series kept for good)."""
        ...


class OpenGate:
    """A gate that refuses nothing."""

    def closed(self) -> bool:
        return False

    def refusal(self, scope: Scope) -> Response | None:
        return None

    def arrive(self, scope: Scope) -> Callable[[], None] | None:
        return None

    def route(self, scope: Scope) -> str:
        return "unmatched"


# For every FastAPI app of the service: FastAPI's native OpenTelemetry wrapper stays off. The
# service exports Prometheus metrics itself, and the wrapper looks up the environment and the
# OTel providers on every request, about a tenth of what a refusal costs.
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


# Refusals at the door are summed up in one log line per this many seconds.
_SUMMARY_PERIOD_S = 1.0
# Room for a multipart form's boundaries and other fields around an uploaded file.
_FORM_OVERHEAD = 64 * 1024


class Door:
    """Refusals before a request's body is read: while admission is full, a translation request
    gets its dialect's 429 (from its ``Gate``) at once. The middleware asks for every request it
    sees; the service's doorway and HTTP protocol (``frontend.doorway``, ``frontend.protocol``)
    ask earlier still, before a request becomes an ASGI request at all, and write the answer
    themselves. Either way it is recorded here: in the metrics at the end of the period (or
    when this process's metrics are rendered, whichever comes first), and logged as one line per
    period with the count, routes and durations. A flood's refusals are over in milliseconds;
    their metrics, a few microseconds each (more with several processes' shared files), are
    counted after them rather than between them."""

    def __init__(self, metrics: Metrics, gate: Gate | None = None) -> None:
        gate = gate or OpenGate()
        self.closed = gate.closed
        self.refusal = gate.refusal
        self.arrive = gate.arrive
        self._route = gate.route
        self.request_id = RequestIds()
        self._requests = Children(metrics.requests)
        self._durations = Children(metrics.request_duration)
        # This period's refusals (route, method, seconds), the first ``_counted`` of them in
        # the metrics already.
        self._period: list[tuple[str, str, float]] = []
        self._counted = 0
        self._summary: asyncio.TimerHandle | None = None
        self._refused = 0
        metrics.before_render.append(self.count)

    def refused(self) -> int:
        """Requests refused at the door so far."""
        return self._refused

    def record(self, scope: Scope, seconds: float) -> None:
        """One request refused at the door, ``seconds`` after its first byte."""
        self._refused += 1
        if not self._period:
            self._summary = asyncio.get_running_loop().call_later(_SUMMARY_PERIOD_S, self.flush)
        self._period.append((self._route(scope), scope["method"], seconds))

    def count(self) -> None:
        """The refusals recorded since the last count, into the metrics."""
        for route, method, seconds in self._period[self._counted :]:
            self._requests(route, method, "429").inc()
            self._durations(route, method).observe(seconds)
        self._counted = len(self._period)

    def close(self) -> None:
        """On shutdown: the refusals of the last period logged now, not by a timer that would
        fire after the app is gone (or never, once its loop stops)."""
        if self._summary is not None:
            self._summary.cancel()
        self.flush()

    def flush(self) -> None:
        self._summary = None
        self.count()
        period, self._period, self._counted = self._period, [], 0
        if not period:
            return
        durations = sorted(seconds for _, _, seconds in period)
        routes = dict(Counter(route for route, _, _ in period))
        log.info(
            "refused at the door",
            extra={
                "status": 429,
                "count": len(durations),
                "routes": routes,
                "duration_ms_p50": round(durations[len(durations) // 2] * 1000, 3),
                "duration_ms_p99": round(durations[int(len(durations) * 0.99)] * 1000, 3),
                "duration_ms_max": round(durations[-1] * 1000, 3),
            },
        )


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        max_body_bytes: int,
        door: Door | None = None,
        uploads: frozenset[str] = frozenset(),
        max_upload_bytes: int = 0,
        dialects: tuple[Dialect, ...] = (),
    ) -> None:
        self.app = app
        # Mounted dialects, longest prefix first: whose error shape a path answers in.
        self.dialects = tuple(sorted(dialects, key=lambda d: -len(d.prefix)))
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        # Routes that take a file: their bodies may be up to max_upload_bytes (and a form's
        # boundaries) instead.
        self.uploads = uploads
        self.max_upload_bytes = max_upload_bytes
        self.door = door or Door(metrics)
        self._requests = Children(metrics.requests)
        self._durations = Children(metrics.request_duration)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = self.door.request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in _DEFAULT_HEADERS if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        refused = False
        try:
            refusal = self.door.refusal(scope)
            if refusal is not None:
                refused = True
                await refusal(scope, receive, send_with_id)
                return
            limit = self._limit(scope)
            body = await self._read_body(scope, receive, limit)
            invalid = None if body is None else lone_surrogate(body)
            encoding = (_header(scope, b"content-encoding") or "identity").strip().lower()
            if body is None:
                too_large = PayloadTooLarge(self._too_large(limit))
                await self._dialect(scope).response(too_large)(scope, receive, send_with_id)
            elif body and encoding != "identity":
                unread = UnsupportedEncoding(
                    f"Content-Encoding {encoding[:32]!r} is not accepted: send the body as it is"
                )
                await self._dialect(scope).response(unread)(scope, receive, send_with_id)
            elif invalid is not None:
                error = InvalidInput(f"{invalid}: not valid Unicode (a lone surrogate)")
                await self._dialect(scope).response(error)(scope, receive, send_with_id)
            else:
                finished = await self._call_until_disconnect(scope, body, receive, send_with_id)
                if not finished and not response_started:
                    status = 499  # nginx's "client closed request"
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id})
            if not response_started:
                failed = ServiceError("internal server error")
                await self._dialect(scope).response(failed)(scope, receive, send_with_id)
        finally:
            if refused and status == 429:
                self.door.record(scope, time.perf_counter() - started)
            else:
                self._record(scope, status, time.perf_counter() - started, request_id)

    def _limit(self, scope: Scope) -> int:
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        if path in self.uploads:
            return max(self.max_body_bytes, self.max_upload_bytes + _FORM_OVERHEAD)
        return self.max_body_bytes

    def _dialect(self, scope: Scope) -> Dialect:
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        for dialect in self.dialects:
            if path == dialect.prefix or path.startswith(f"{dialect.prefix}/"):
                return dialect
        return NATIVE

    @staticmethod
    def _too_large(limit: int) -> str:
        return f"request body over {limit} bytes"

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> bytes | None:
        """The whole request body, or None when it is over the limit (413 without reading on)."""
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _call_until_disconnect(
        self, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> bool:
        """Run the app on the buffered body; cancel it if the client disconnects first.

        The app runs in this task, not a task of its own: it then reaches admission before
        the event loop serves any other request. From its own task it ran only on the loop's
        next turn, after every other request of the same burst had passed the check for a
        full queue, and hundreds of them went the long way to a refusal.

        Returns False when the client went away before the app finished.
        """
        disconnected = asyncio.Event()
        replayed = False
        current = asyncio.current_task()
        assert current is not None

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    current.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, replay, send)
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise  # the server is cancelling us, not the client leaving
            current.uncancel()
            return False
        finally:
            watcher.cancel()
        if disconnected.is_set() and current.cancelling():
            current.uncancel()  # the app finished anyway; the request task goes on
        return True

    def _record(self, scope: Scope, status: int, seconds: float, request_id: str) -> None:
        route = _route_template(scope)
        method = scope["method"]
        self._requests(route, method, str(status)).inc()
        self._durations(route, method).observe(seconds)
        log.info(
            "request",
            extra={
                "request_id": request_id,
                "method": method,
                "route": route,
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
            },
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestIds:
    """Request ids: the client's X-Request-ID when it is sane, else a new random one.

    From a generator seeded once per process: ``os.urandom`` made a system call for each, a
    noticeable share of a refusal. Ids need to be unique, not unpredictable.
    """

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(16))

    def __call__(self, scope: Scope) -> str:
        given = _header(scope, b"x-request-id")
        if given and _REQUEST_ID.match(given):
            return given
        return f"{self._random.getrandbits(128):032x}"


def _route_template(scope: Scope) -> str:
    """The matched route's template; mounted dialects keep their prefix (``/v2/translate``)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if not path:
        return "unmatched"
    return f"{scope.get('root_path', '')}{path}"
