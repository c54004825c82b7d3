"""Refusals answered from a request's raw bytes, before any HTTP parser or ASGI request exists.

While admission is full most of what arrives is a request to refuse, whole in one read. Parsing
it through httptools and uvicorn's per-request state (scope, cycle, events, keep-alive timer),
let alone building uvicorn's per-connection protocol for it, was most of what a refusal cost.
Here a plain ``POST`` with a ``Content-Length`` body is read just far enough to ask the app's
``Door`` about its path, and answered with the door's refusal; anything unusual (a body not yet
all here, chunked, ``Expect``, ``Connection``, ``Upgrade``, an escaped or queried path, a
request the door lets in) is left to the parser, from that request on.
"""

from __future__ import annotations

import re
import time
from http import HTTPStatus
from typing import Any, cast

from starlette.types import Scope

from service.frontend.api.middleware import Door

# Requests whose head is larger than this are left to the parser (and its limits).
_MAX_FAST_HEAD = 8192
# Content-Length values of more digits than this (more than any body the service takes) are
# left to the parser.
_MAX_LENGTH_DIGITS = 15
# Requests with more header lines than this are left to the parser (and its limit).
_MAX_FAST_HEADERS = 64
# Headers that change how a request is framed or how its connection goes on.
_LEFT_TO_THE_PARSER = frozenset((b"transfer-encoding", b"expect", b"connection", b"upgrade", b"te"))


def whole_request(data: bytes, start: int = 0) -> tuple[str, bytes | None, int] | None:
    """(path, X-Request-ID, length) of the POST request at ``start`` in ``data`` when it is all
    there and plain HTTP/1.1 with a ``Content-Length`` body, framed exactly as the parser would
    frame it; else None (the parser answers it, a 400 where it is malformed)."""
    end = data.find(b"\r\n\r\n", start, start + _MAX_FAST_HEAD)
    if end < 0:
        return None
    return _framed(data, start, end, read_head(data[start:end]))


def read_head(head: bytes) -> tuple[str, bytes | None, int] | None:
    """(path, X-Request-ID, Content-Length) of a request head (up to its blank line) that is
    plain HTTP/1.1 as ``whole_request`` takes it; else None."""
    # A bare CR or LF ends a line for nobody here and is the parser's 400.
    lines_ends = head.count(b"\r\n")
    if head.count(b"\r") != lines_ends or head.count(b"\n") != lines_ends:
        return None
    if lines_ends > _MAX_FAST_HEADERS:
        return None  # the parser counts them against the service's limit
    request_line = _REQUEST_LINE.match(head)
    if request_line is None:
        return None
    # Every line after the request line a well-formed header (the matches start at a line's
    # CRLF and end at the next, so as many matches as line ends means no line was skipped).
    fields = _FIELD.findall(head, request_line.end())
    if len(fields) != lines_ends:
        return None  # malformed: the parser answers it
    length: int | None = None
    request_id: bytes | None = None
    for name, value in fields:
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            # Python's int() refuses strings of over 4,300 digits: a long one is the parser's.
            if length is not None or not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                return None
            length = int(value)
        elif name == b"x-request-id":
            request_id = value
        elif name in _LEFT_TO_THE_PARSER:
            return None
    if length is None:
        return None
    return request_line.group(1).decode("ascii"), request_id, length


def _framed(
    data: bytes, start: int, end: int, head: tuple[str, bytes | None, int] | None
) -> tuple[str, bytes | None, int] | None:
    """``whole_request``'s answer for the head ``data[start:end]`` read as ``head``: None unless
    its body is all there too."""
    if head is None:
        return None
    path, request_id, length = head
    total = end + 4 + length - start
    if len(data) - start < total:
        return None
    return path, request_id, total


class KnownHeads:
    """``whole_request`` with the heads read before remembered: a flood's requests come from a
    few clients whose heads differ by little more than their Content-Length, and reading a
    head (its lines checked, its fields matched) was half of what a refusal cost. At most
    ``size`` heads of ``longest`` bytes or fewer are kept (all forgotten when full), each with
    what ``read_head`` made of it, so a head never seen costs what it did."""

    def __init__(self, size: int = 512, longest: int = 1024) -> None:
        self.size = size
        self.longest = longest
        self._known: dict[bytes, tuple[str, bytes | None, int] | None] = {}

    def whole_request(self, data: bytes, start: int = 0) -> tuple[str, bytes | None, int] | None:
        end = data.find(b"\r\n\r\n", start, start + _MAX_FAST_HEAD)
        if end < 0:
            return None
        head = data[start:end]
        try:
            read = self._known[head]
        except KeyError:
            read = read_head(head)
            if len(head) <= self.longest:
                if len(self._known) >= self.size:
                    self._known.clear()
                self._known[head] = read
        return _framed(data, start, end, read)


# ``POST`` of an origin-form path of visible ASCII, without a query or an escape, HTTP/1.1.
_REQUEST_LINE = re.compile(rb"POST (/[\x21-\x24\x26-\x3e\x40-\x7e]*) HTTP/1\.1(?=\r\n|\Z)")
# A header line: a token, a colon, the value without control characters but tabs (the parser's
# rules), up to the line's end. Possessive: nothing is tried twice, so a head of any shape costs
# time in proportion to its length (a value of spaces ending in a control character took a
# backtracking pattern a second per request).
_FIELD = re.compile(rb"\r\n([!#$%&'*+.^_`|~0-9A-Za-z-]++):([^\x00-\x08\x0a-\x1f\x7f]*+)(?=\r\n|\Z)")


def door_scope(path: str, request_id: bytes | None, root_path: str) -> Scope:
    """What the door is asked about a request read here (``whole_request``): its method, path
    and request id, as the ASGI scope the parser would have built says them."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": root_path,
        "headers": [(b"x-request-id", request_id)] if request_id is not None else [],
    }
    return cast(Scope, scope)


class CachedHeads:
    """The head of the last refusal written, up to its request id, while it says the same."""

    def __init__(self) -> None:
        self._key: tuple[object, object] | None = None
        self._head = b""

    def head(self, refusal: Any, default_headers: list[tuple[bytes, bytes]]) -> bytes:
        if self._key is None or self._key[0] is not refusal or self._key[1] is not default_headers:
            status = refusal.status_code
            head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
            for name, value in (*default_headers, *refusal.raw_headers):
                head += (name, b": ", value, b"\r\n")
            head.append(b"x-request-id: ")
            self._key, self._head = (refusal, default_headers), b"".join(head)
        return self._head


def refuse_whole_requests(
    door: Door,
    heads: CachedHeads,
    default_headers: list[tuple[bytes, bytes]],
    root_path: str,
    data: bytes,
    known: KnownHeads | None = None,
) -> tuple[list[bytes], bytes]:
    """The answers to the refused requests at the start of ``data`` that it holds whole, each
    recorded by the door, and the bytes after them (from the first request left to the parser)."""
    answers: list[bytes] = []
    at = 0  # where the next request starts: ``data`` is cut once, at the end
    while at < len(data):
        started = time.perf_counter()
        whole = whole_request(data, at) if known is None else known.whole_request(data, at)
        if whole is None:
            break
        path, request_id, length = whole
        scope = door_scope(path, request_id, root_path)
        refusal = door.refusal(scope)
        if refusal is None:
            break
        answers.append(
            heads.head(refusal, default_headers)
            + door.request_id(scope).encode()
            + b"\r\n\r\n"
            + refusal.body
        )
        at += length
        door.record(scope, time.perf_counter() - started)
    return answers, data[at:] if at else data
