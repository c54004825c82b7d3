"""Refusals from raw bytes (``frontend.refusals``) against the HTTP parser the service runs:
whatever the door frames as a whole request, httptools reads as that same request."""

from __future__ import annotations

import time

import httptools
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.frontend import refusals
from service.frontend.refusals import KnownHeads, whole_request


class _Parsed:
    """What httptools reads: the target, the headers, the body and the messages completed."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete += 1


_PIECES = st.sampled_from(
    [b"POST ", b"/translate", b" HTTP/1.1", b"HTTP/1.0", b"\r\n", b"\n", b"\r", b": ", b":",
     b"Content-Length", b"content-length", b"X-Request-ID", b"Host", b"Transfer-Encoding",
     b"chunked", b" ", b"\t", b"0", b"3", b"12", b"abc", b"\xff", b"\x00", b"/v2/translate",
     b"x" * 20, b"\r\n\r\n", b"Content-Length: 3\r\n", b"Host: x\r\n", b"X-Request-ID: r1\r\n"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@example(data=b"POST /t HTTP/1.1\r\nX: a\nContent-Length: 3\r\n\r\nabc")
@example(data=b"POST /t HTTP/1.1\r\nX: a\r\n Content-Length: 3\r\n\r\nabc")
@example(data=b"POST /t HTTP/1.1\r\nContent-Length: 3\rX: 1\r\n\r\nabc")
@example(data=b"POST /t HTTP/1.1\r\nX\x00: 1\r\nContent-Length: 3\r\n\r\nabc")
@example(data=b"POST /t HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
@given(
    data=st.lists(_PIECES, max_size=16).map(
        lambda pieces: b"POST /translate HTTP/1.1\r\n" + b"".join(pieces) + b"\r\n\r\nabcdefghijkl"
    )
)
def test_what_the_door_frames_as_a_request_httptools_reads_as_the_same(data: bytes) -> None:
    """A request the door answers from its bytes must be one the parser reads the same way
    (its target, its body's length, its X-Request-ID), or the connection's next request would
    start at a different byte for the door than for the parser; a head the parser rejects is
    left to it (its 400), never framed here."""
    framed = whole_request(data)
    if framed is None:
        return
    path, request_id, total = framed
    parsed = _Parsed()
    httptools.HttpRequestParser(parsed).feed_data(data[:total])  # raises where it rejects
    assert parsed.complete == 1
    assert parsed.url == path.encode()
    head_end = data.index(b"\r\n\r\n") + 4
    assert len(parsed.body) == total - head_end
    ids = [value for name, value in parsed.headers if name.lower() == b"x-request-id"]
    assert (ids[-1].strip() if ids else None) == request_id


_HEADS = st.lists(_PIECES, max_size=12).map(
    lambda pieces: b"POST /translate HTTP/1.1\r\n" + b"".join(pieces) + b"\r\n\r\n"
)


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(
        st.tuples(_HEADS, st.binary(max_size=16), st.integers(min_value=0, max_value=8)),
        min_size=1,
        max_size=24,
    ),
    size=st.integers(min_value=1, max_value=4),
)
def test_the_heads_remembered_frame_every_request_as_reading_it_afresh_does(
    requests: list[tuple[bytes, bytes, int]], size: int
) -> None:
    """Each head read once is remembered with what was made of it; a head seen again (the same
    bytes, another body, more or fewer bytes of it here, at another offset) must be framed as
    reading it again would, and so must a head seen after the remembered ones were forgotten."""
    known = KnownHeads(size=size, longest=64)
    for head, body, start in requests:
        data = b"x" * start + head + body
        assert known.whole_request(data, start) == whole_request(data, start)


def test_a_head_seen_before_is_not_read_again_and_at_most_size_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[bytes] = []
    read = refusals.read_head

    def counted(head: bytes) -> tuple[str, bytes | None, int] | None:
        reads.append(head)
        return read(head)

    monkeypatch.setattr(refusals, "read_head", counted)
    known = KnownHeads(size=2, longest=256)
    a, b, c = (
        f"POST /translate HTTP/1.1\r\nContent-Length: {n}\r\n\r\n".encode() for n in (1, 2, 3)
    )
    for data in (a + b"x", a + b"y", b + b"zz", a + b"w"):
        known.whole_request(data)
    assert len(reads) == 2  # a once, b once
    known.whole_request(c + b"abc")  # a third: the two kept are forgotten
    known.whole_request(a + b"x")
    assert len(reads) == 4
    long = b"POST /translate HTTP/1.1\r\nX: " + b"v" * 300 + b"\r\nContent-Length: 0\r\n\r\n"
    known.whole_request(long)
    known.whole_request(long)
    assert len(reads) == 6  # longer than ``longest``: never kept


def test_a_head_of_any_shape_is_read_in_time_proportional_to_its_length() -> None:
    """A header value of 8,000 spaces ending in a control character took a backtracking
    pattern a second per request (a ReDoS of the event loop); every shape of head up to the
    fast path's limit is read in a pass. The bound is a thousand times what a pass takes."""
    heads = [
        b"POST /translate HTTP/1.1\r\nX: " + b" " * 8000 + b"\x01\r\nContent-Length: 0",
        b"POST /translate HTTP/1.1\r\nX: a" + b" \t" * 4000 + b"\x7f\r\nContent-Length: 0",
        b"POST /translate HTTP/1.1\r\n" + b"a:b\r\n" * 1600 + b"Content-Length: 0",
        b"POST /translate HTTP/1.1\r\n" + b"a" * 8000 + b":\r\nContent-Length: 0",
        b"POST /" + b"a" * 8000 + b"\x01 HTTP/1.1\r\nContent-Length: 0",
    ]
    started = time.perf_counter()
    for head in heads:
        whole_request(head + b"\r\n\r\n")
    assert time.perf_counter() - started < 0.5
