"""Named bad inputs through HTTP on the demo model: each answered, never a 5xx."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import ServiceClient


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"text": "x" * 100_000, "target_lang": "de"}, "text_too_long"),
        ({"text": 42, "target_lang": "de"}, "validation_error"),
        ({"text": ["a"], "target_lang": "de"}, "validation_error"),
        ({"text": "hi", "target_lang": None}, "validation_error"),
        ({"target_lang": "de"}, "validation_error"),
        ({"text": "", "target_lang": "de"}, "validation_error"),
        ({"text": " \t\n ", "target_lang": "de"}, "invalid_input"),
        ({"text": "hi", "target_lang": "klingon"}, "unknown_language"),
    ],
)
async def test_bad_fields_are_422(demo: ServiceClient, body: object, code: str) -> None:
    response = await demo.http.post("/translate", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe\xfa not utf-8",
        b'{"text": "\xc3\x28", "target_lang": "de"}',
        b'{"text": "unterminated',
        b"",
        b"null",
        b"[]",
    ],
)
async def test_undecodable_bodies_are_422(demo: ServiceClient, raw: bytes) -> None:
    response = await demo.http.post(
        "/translate", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    "text",
    [
        "NUL \x00 and bell \x07 and escape \x1b[31m inside",
        "emoji 🎉👩‍💻🇩🇪 and a zero-width joiner",
        "مرحبا بالعالم، هذا نص من اليمين إلى اليسار",
        "עברית\u200fמימין לשמאל",
        "mixed \u202eoverride\u202c direction",
        '{"json": "inside"} and <b>markup</b>',
    ],
)
async def test_unusual_text_is_translated(demo: ServiceClient, text: str) -> None:
    response = await demo.http.post("/translate", json={"text": text, "target_lang": "en"})
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["translation"], str)


async def test_odd_cases_of_language_codes(demo: ServiceClient) -> None:
    for code, canonical in (("DE", "de"), ("zH-hAnT", "zh-Hant"), ("Yue", "yue")):
        response = await demo.http.post("/translate", json={"text": "hi", "target_lang": code})
        assert response.status_code == 200
        assert response.json()["target_lang"] == canonical


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/translate", {"text": "hello", "target_lang": "de"}, lambda b: b["error"]["message"]),
        ("/v2/translate", {"text": ["hello"], "target_lang": "DE"}, lambda b: b["message"]),
        (
            "/libretranslate/translate",
            {"q": "hello", "source": "en", "target": "de"},
            lambda b: b["error"],
        ),
        ("/language/translate/v2", {"q": "hello", "target": "de"}, lambda b: b["error"]["message"]),
    ],
)
async def test_a_compressed_body_is_415_in_the_route_s_shape_not_called_not_utf8(
    demo: ServiceClient, path: str, body: dict[str, object], shape: Callable[[Any], str]
) -> None:
    # Found by a probe: a gzip body (Content-Encoding: gzip) was read as it came and refused as
    # "the body is not UTF-8", which tells a client nothing it can act on.
    compressed = gzip.compress(json.dumps(body).encode())
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    response = await demo.http.post(path, content=compressed, headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Encoding 'gzip' is not accepted" in shape(response.json())
    plain = await demo.http.post(path, json=body, headers={"content-encoding": "identity"})
    assert plain.status_code == 200, plain.text


_SHAPES: list[tuple[str, Callable[[Any], str]]] = [
    ("/translate", lambda b: b["error"]["message"]),
    ("/v2/translate", lambda b: b["message"]),
    ("/libretranslate/translate", lambda b: b["error"]),
    ("/language/translate/v2", lambda b: b["error"]["message"]),
    ("/v3/projects/p:translateText", lambda b: b["error"]["message"]),
    ("/v1/chat/completions", lambda b: b["error"]["message"]),
]


@pytest.mark.parametrize(("path", "shape"), _SHAPES)
async def test_a_body_over_the_limit_is_413_in_the_route_s_shape(
    demo: ServiceClient, path: str, shape: Callable[[Any], str]
) -> None:
    # Found by a probe: the size check before any route answered in the native shape, so a
    # DeepL client read {"error": {...}} where it reads {"message": ...}.
    huge = b'{"text": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    response = await demo.http.post(
        path, content=huge, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert "request body over" in shape(response.json())
