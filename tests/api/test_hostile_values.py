"""Every route, every dialect, fed arbitrary JSON values (hypothesis): lone surrogates, huge
integers, NaN and infinities, nested junk, under the field names the routes read. None may be
answered with a 5xx or anything but JSON; a lone surrogate is a 4xx in the route's own shape."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config.settings import Settings
from service.frontend.api.surrogates import _encodable, lone_surrogate
from tests.conftest import own_data, served
from tests.fakes import FakeControl

KEY = "hostile-key"
# (method, path) of every route that reads a body or a query; path parameters filled in.
ROUTES = [
    ("POST", "/translate"),
    ("POST", "/batch_translate"),
    ("POST", "/translate/stream"),
    ("POST", "/prompt"),
    ("POST", "/detect"),
    ("GET", "/translate"),
    ("POST", "/libretranslate/translate"),
    ("POST", "/libretranslate/detect"),
    ("POST", "/libretranslate/translate_file"),
    ("POST", "/libretranslate/suggest"),
    ("GET", "/libretranslate/languages"),
    ("POST", "/v2/translate"),
    ("POST", "/v2/languages"),
    ("POST", "/v2/usage"),
    ("POST", "/v2/glossaries"),
    ("GET", "/v2/glossaries/{id}"),
    ("DELETE", "/v2/glossaries/{id}"),
    ("GET", "/v2/glossaries/{id}/entries"),
    ("POST", "/v2/document"),
    ("POST", "/v2/document/{id}"),
    ("POST", "/v2/document/{id}/result"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
]
# A valid body of each route that takes one (generated fields replace or join its fields).
_TRANSLATION = {"text": "Hello there.", "target_lang": "de", "source_lang": "en"}
VALID: dict[str, dict[str, Any]] = {
    "/translate": _TRANSLATION,
    "/translate/stream": _TRANSLATION,
    "/prompt": _TRANSLATION,
    "/batch_translate": {"texts": ["Hello.", "Bye."], "target_lang": "de"},
    "/detect": {"texts": ["Hello there."]},
    "/libretranslate/translate": {"q": "Hello.", "source": "en", "target": "de"},
    "/libretranslate/detect": {"q": "Hello."},
    "/v2/translate": {"text": ["Hello."], "target_lang": "DE"},
    "/v2/glossaries": {
        "name": "g",
        "source_lang": "en",
        "target_lang": "de",
        "entries": "a\tb",
        "entries_format": "tsv",
    },
    "/v1/chat/completions": {"model": "fake", "messages": [{"role": "user", "content": "Hi"}]},
}
# The names the routes read, so generated bodies reach their code, not only the validator.
FIELDS = [
    "text", "texts", "q", "target_lang", "source_lang", "source", "target", "format",
    "api_key", "auth_key", "glossary_id", "glossary", "context", "style", "preferences",
    "delimiter", "name", "entries", "entries_format", "document_key", "alternatives",
    "model", "messages", "role", "content", "top_k", "top_p", "temperature", "max_tokens",
    "max_completion_tokens", "repetition_penalty", "n", "stream", "stop", "formality",
    "split_sentences", "tag_handling", "ignore_tags", "show_billed_characters", "type",
]  # fmt: skip
SURROGATES = st.sampled_from(
    [
        "\ud800",
        "\udfff",
        "a\udc00b",
        "\ud83d",
        "x\ud800\ud800",
        "\U0001f600",
        "\\\ud83d",
        "\\ud83d\ude00",
    ]
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**20, -(10**20), 2**63, 2**64, 1e-300, 1e300, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXTS = st.one_of(
    st.text(max_size=40),
    SURROGATES,
    st.sampled_from(["de", "EN", "zh", "auto", "html", "user", "text", KEY, ""]),
)
SCALARS = st.one_of(SURROGATES, NUMBERS, TEXTS, st.none(), st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), TEXTS), inner, max_size=4),
    ),
    max_leaves=12,
)
BODIES = st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8)


@pytest.fixture(scope="module")
def hostile(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A keyed service of the family with every option (Hy-MT2) on a fake engine."""
    fake = FakeControl(tmp_path_factory.mktemp("hostile-fake"))
    configured = Settings(
        _env_file=None,
        data_dir=own_data(data_dir, tmp_path_factory.mktemp("hostile") / "data"),
        warmup=False,
        api_keys=[KEY],
        model_family="hy-mt2",
        model_size="1.8b",
    )
    with served(configured, fake.loader()) as client:
        yield client


def _encoded(body: dict[str, Any]) -> bytes:
    # As a client's JSON library writes it: NaN and Infinity as such, surrogates as escapes.
    return json.dumps(body, allow_nan=True).encode()


@pytest.mark.parametrize(("method", "path"), ROUTES)
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(body=BODIES, keyed=st.sampled_from(["header", "body", "none"]))
def test_no_route_fails_on_arbitrary_json(
    hostile: httpx.Client, method: str, path: str, body: dict[str, Any], keyed: str
) -> None:
    headers = {"content-type": "application/json"}
    if keyed == "header":
        headers["authorization"] = f"Bearer {KEY}"
    elif keyed == "body":  # where DeepL and LibreTranslate clients send it
        body = {"auth_key": KEY, "api_key": KEY, **body}
    # Over a valid request of the route's own, so the generated values get past its shape.
    body = {**VALID.get(path, {}), **body}
    url = path.replace("{id}", "0123")
    response = hostile.request(method, url, content=_encoded(body), headers=headers)
    assert response.status_code < 500, (method, path, body, response.text)
    kind = response.headers.get("content-type", "")
    assert kind.startswith(("application/json", "text/event-stream")), (body, kind)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return True
    return False


# The routes that read a JSON body (a document upload reads a form; suggestions, off, are refused
# before their body is read).
JSON_ROUTES = [
    path
    for method, path in ROUTES
    if method == "POST" and "document" not in path and not path.endswith(("_file", "suggest"))
] + ["/language/translate/v2", "/v3/projects/p/locations/global:translateText"]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(JSON_ROUTES),
    deeper=st.integers(1, 20_000),
    opening=st.sampled_from(["[", '{"a":']),
    undecodable=st.binary(min_size=1, max_size=8).filter(_not_utf8),
    flaw=st.sampled_from(["nested", "bytes"]),
)
def test_a_body_too_deep_or_not_utf8_is_a_4xx_that_says_so(
    hostile: httpx.Client, path: str, deeper: int, opening: str, undecodable: bytes, flaw: str
) -> None:
    # Valid JSON nested past the parser's depth (the interpreter's recursion limit, which the
    # test runner raises), or bytes that are not UTF-8, inside an otherwise valid request: each
    # route answers in its shape and names the flaw, where both once read "not valid UTF-8
    # JSON" or "neither JSON nor a form".
    depth = sys.getrecursionlimit() + deeper
    start = _encoded({"auth_key": KEY, **VALID.get(path, {})})[:-1]
    if flaw == "nested":
        closing = "]" if opening == "[" else "}"
        body = start + f', "x": {opening * depth}1{closing * depth}}}'.encode()
        said = "nests too deeply"
    else:
        body = start + b', "x": "' + undecodable + b'"}'
        said = "not UTF-8"
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    response = hostile.post(path, content=body, headers=headers)
    assert 400 <= response.status_code < 500, (path, flaw, depth, response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert said in response.text, (path, flaw, depth, response.status_code, response.text)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v2/translate", {"text": ["hi"], "target_lang": "de", "auth_key": "\ud800"}),
        ("/v2/translate", {"text": ["hi"], "target_lang": "de", "glossary_id": "\ud800"}),
        ("/v2/translate", {"text": ["hi"], "target_lang": "de", "context": "\ud800"}),
        ("/libretranslate/translate", {"q": "hi", "target": "de", "api_key": "\ud800"}),
        ("/v1/chat/completions", {"model": "\ud800", "messages": [{"role": "user"}]}),
        ("/translate", {"text": "hi", "target_lang": "de", "glossary": {"\ud800": "x"}}),
        ("/v2/glossaries", {"name": "\ud800", "target_lang": "de", "entries": "a\tb"}),
        ("/v2/glossaries", {"name": "n", "target_lang": "de", "entries": "a\ud800\tb"}),
    ],
)
def test_the_probe_s_surrogates_are_4xx(
    hostile: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    """The attacker's requests (issue 34, finding 4): each was a 500, some text/plain."""
    keyed = {"source_lang": "en", "auth_key": KEY, **body}
    response = hostile.post(
        path,
        content=_encoded(keyed),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"}
        if path in ("/v1/chat/completions", "/translate")
        else {"content-type": "application/json"},
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "lone surrogate" in response.text


def _raw(body: dict[str, Any]) -> bytes:
    # A surrogate as the bytes UTF-8 would give it (ED A0 80), not escaped: not valid UTF-8,
    # but Python's json.loads reads it as it reads the escape.
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize(("method", "path"), [r for r in ROUTES if r[0] != "GET"])
@pytest.mark.parametrize("field", ["text", "auth_key", "api_key", "model", "glossary_id", "name"])
@pytest.mark.parametrize("encode", [_encoded, _raw], ids=["escaped", "raw"])
def test_a_lone_surrogate_is_a_4xx_in_the_route_s_shape(
    hostile: httpx.Client,
    method: str,
    path: str,
    field: str,
    encode: Callable[[dict[str, Any]], bytes],
) -> None:
    body = {field: "\ud800", "target_lang": "de", "text": "hello", "q": "hi", "target": "de"}
    body[field] = "\ud800"
    response = hostile.request(
        method,
        path.replace("{id}", "0123"),
        content=encode(body),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()
    if path.startswith("/v2/"):
        assert "lone surrogate" in error["message"]  # DeepL's {"message"}
    elif path.startswith("/libretranslate/"):
        assert "lone surrogate" in error["error"]  # LibreTranslate's {"error": "..."}
    else:
        assert "lone surrogate" in error["error"]["message"]
    assert field in json.dumps(error)


@pytest.mark.parametrize(
    "sampling",
    [
        {"top_k": 10**20},
        {"temperature": 1e-300},
        {"top_p": 1e-300, "temperature": 1e-300},
        {"repetition_penalty": 1e-300},
        {"max_tokens": 10**20},
        {"n": 10**20},
    ],
)
def test_extreme_sampling_values_are_clamped_or_refused(
    hostile: httpx.Client, sampling: dict[str, float]
) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    model = hostile.get("/v1/models", headers=auth).json()["data"][0]["id"]
    response = hostile.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hello"}], **sampling},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert response.status_code in (200, 400, 422), response.text
    if response.status_code == 200:
        assert not math.isnan(response.json()["usage"]["completion_tokens"])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.recursive(st.one_of(st.text(), SURROGATES, st.just("\\")), st.lists, max_leaves=8))
def test_lone_surrogates_are_found_exactly(value: object) -> None:
    """Pairs (every emoji Python's json writes) pass; a lone one anywhere is found, escaped
    backslashes before it or not."""

    def strings(item: object) -> list[str]:
        return (
            [t for child in item for t in strings(child)] if isinstance(item, list) else [str(item)]
        )

    lone = any(not _encodable(text) for text in strings(value))
    assert (lone_surrogate(json.dumps(value).encode()) is not None) == lone
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert (lone_surrogate(raw) is not None) == lone


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/health", None),
        ("GET", "/no/such/route", None),
        ("POST", "/translate", {"text": "Hello.", "target_lang": "de"}),
        ("POST", "/v2/usage", {}),
        ("GET", "/v1/models", None),
        ("POST", "/libretranslate/translate", {"q": "Hi.", "source": "en", "target": "de"}),
        ("GET", "/v2/glossaries", None),
    ],
)
def test_every_answer_is_neither_sniffed_framed_nor_stored(
    hostile: httpx.Client, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """Issue 34, finding 7: no answer carried nosniff or frame-ancestors, and keyed answers
    other than GET /translate no Cache-Control."""
    response = hostile.request(
        method, path, json=body, headers={"authorization": f"DeepL-Auth-Key {KEY}"}
    )
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"


def test_the_page_has_a_strict_policy_and_html_results_are_not_pages(
    hostile: httpx.Client,
) -> None:
    page = hostile.get("/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    auth = {"authorization": f"DeepL-Auth-Key {KEY}"}
    job = hostile.post(
        "/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("page.html", b"<p>Hello <b>there</b>.</p>")},
        headers=auth,
    ).json()
    key = {"document_key": job["document_key"]}
    deadline = time.monotonic() + 60
    while hostile.post(f"/v2/document/{job['document_id']}", json=key, headers=auth).json()[
        "status"
    ] not in ("done", "error"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    result = hostile.post(f"/v2/document/{job['document_id']}/result", json=key, headers=auth)
    assert result.status_code == 200
    assert result.headers["content-type"].startswith("text/plain")
    assert result.headers["content-disposition"].startswith("attachment")


def test_the_openai_route_checks_the_key_before_the_body(hostile: httpx.Client) -> None:
    """Issue 34, finding 7: a malformed body without a key was a 400, telling its schema."""
    answer = hostile.post("/v1/chat/completions", json={"messages": 3})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] in ("invalid_api_key", "unauthenticated")


# The form fields of a document upload and of a glossary, each of which a client may repeat.
FORM_FIELDS = {
    "/v2/document": (
        "target_lang",
        "source_lang",
        "output_format",
        "formality",
        "glossary_id",
        "context",
        "filename",
        "custom_instructions",
    ),
    "/v2/glossaries": ("name", "source_lang", "target_lang", "entries", "entries_format"),
    "/libretranslate/translate_file": ("target", "source", "filename", "api_key"),
}
# A valid form of each route, which the drawn fields then override.
FORM_BASE = {
    "/v2/document": {"target_lang": "DE"},
    "/v2/glossaries": {"name": "n", "source_lang": "en", "target_lang": "de", "entries": "a\tb"},
    "/libretranslate/translate_file": {"target": "de", "api_key": KEY},
}
FORM_VALUES = st.one_of(
    st.sampled_from(["DE", "en", "txt", "docx", "more", "tsv", "csv", "auto", "", KEY]),
    st.text(max_size=12),
)


@pytest.mark.parametrize("path", sorted(FORM_FIELDS))
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_a_form_with_any_fields_repeated_is_answered_in_its_shape(
    hostile: httpx.Client, path: str, data: st.DataObject
) -> None:
    """A multipart form whose fields come once, several times or empty: a 4xx or a success in
    the route's JSON, never a 500 (a repeated ``output_format`` was one)."""
    names = FORM_FIELDS[path]
    drawn = data.draw(
        st.dictionaries(st.sampled_from(names), st.lists(FORM_VALUES, min_size=1, max_size=3))
    )
    fields = {**FORM_BASE[path], **drawn}
    files = {"file": ("a.txt", b"Hello there.", "text/plain")}
    answer = hostile.post(
        path, data=fields, files=files, headers={"authorization": f"DeepL-Auth-Key {KEY}"}
    )
    assert answer.status_code < 500, (fields, answer.text)
    assert answer.headers["content-type"].startswith("application/json"), (fields, answer.text)
