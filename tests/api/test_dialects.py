"""Every dialect through the one request context: deadlines in its own shape, malformed bodies
answered with a 4xx in its own shape (never a text/plain 500), before or after the key check."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from service.config.settings import Settings
from tests.conftest import ServiceClient, StartApp, started
from tests.fakes import FakeControl

# route, and the body that asks to translate a text.
DIALECTS: dict[str, tuple[str, Callable[[str], dict[str, object]]]] = {
    "native": ("/translate", lambda text: {"text": text, "target_lang": "de"}),
    "libretranslate": (
        "/libretranslate/translate",
        lambda text: {"q": text, "source": "en", "target": "de"},
    ),
    "deepl": ("/v2/translate", lambda text: {"text": [text], "target_lang": "DE"}),
    "google": ("/language/translate/v2", lambda text: {"q": [text], "target": "de"}),
}


def error_message(dialect: str, body: object) -> str:
    assert isinstance(body, dict), body
    if dialect in ("native", "google"):
        return str(body["error"]["message"])
    if dialect == "libretranslate":
        return str(body["error"])
    return str(body["message"])


@pytest.fixture
async def slow(start_app: StartApp, fake: FakeControl) -> ServiceClient:
    client: ServiceClient = await start_app(loader=fake.loader(delay_s=0.6), warmup=False)
    return client


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_every_dialect_honours_the_deadline_in_its_own_shape(
    slow: ServiceClient, dialect: str
) -> None:
    route, body = DIALECTS[dialect]
    response = await slow.http.post(
        route, json=body(f"late {dialect}"), headers={"X-Request-Timeout": "0.2"}
    )
    assert response.status_code == 504
    assert response.headers["content-type"] == "application/json"
    assert "deadline" in error_message(dialect, response.json())


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_a_timeout_below_the_minimum_is_a_client_error(
    slow: ServiceClient, dialect: str
) -> None:
    route, body = DIALECTS[dialect]
    response = await slow.http.post(route, json=body("hi"), headers={"X-Request-Timeout": "0.001"})
    assert response.status_code == (422 if dialect == "native" else 400)
    assert "X-Request-Timeout" in error_message(dialect, response.json())
    # Not a finite number: said so (a probe's "inf" was told "at least 0.1 seconds").
    for given in ("nan", "inf", "-inf", "1e309"):
        response = await slow.http.post(
            route, json=body("hi"), headers={"X-Request-Timeout": given}
        )
        assert response.status_code == (422 if dialect == "native" else 400)
        assert "not a finite number" in error_message(dialect, response.json())


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_an_unexpected_failure_is_a_500_in_the_dialects_shape(
    slow: ServiceClient, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks inside a route: JSON in the route's own shape, no internals, never
    Starlette's text/plain "Internal Server Error" (the dialects answered that)."""

    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("/work/secret internals")

    translator = slow.runtime.translator
    monkeypatch.setattr(translator, "translate", broken)
    monkeypatch.setattr(translator, "translate_batch", broken)
    route, body = DIALECTS[dialect]
    response = await slow.http.post(route, json=body("hi"))
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert "internal" in error_message(dialect, response.json())
    assert "secret" not in response.text


MALFORMED = {
    "deep nesting": b'{"q": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "huge number": b'{"q": "x", "target": "de", "alternatives": ' + b"9" * 5000 + b"}",
    "lone surrogate": b'{"q": "\\ud800", "text": ["\\ud800"], "target": "de", "target_lang": "DE"}',
    "not utf-8": b'{"q": "\xff\xfe", "target": "de"}',
    "not an object": b"[1, 2, 3]",
    "truncated": b'{"q": "x", "targ',
}


@pytest.fixture(scope="module", params=[False, True], ids=["open", "keyed"])
async def plain(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> AsyncIterator[ServiceClient]:
    """A fake-engine service without keys and one with keys, shared by the malformed cases."""
    fake = FakeControl(tmp_path_factory.mktemp("fake"))
    keys = ["k"] if request.param else []
    settings = Settings(_env_file=None, data_dir=data_dir, warmup=False, api_keys=keys)
    async with started(settings, fake.loader()) as client:
        yield client


@pytest.mark.parametrize("dialect", ["libretranslate", "deepl"])
@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_bodies_get_a_4xx_in_the_dialects_shape(
    plain: ServiceClient, dialect: str, case: str
) -> None:
    client = plain
    route, _ = DIALECTS[dialect]
    response = await client.http.post(
        route, content=MALFORMED[case], headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, (case, response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    error_message(dialect, response.json())


@pytest.mark.parametrize(
    "form",
    [
        {"q": "hello", "target": "de", "alternatives": "abc"},
        {"q": "hello", "target": "de", "format": "pdf"},
        {"target": "de"},
        {"q": "hello"},
    ],
)
async def test_bad_libretranslate_forms_are_400(plain: ServiceClient, form: dict[str, str]) -> None:
    client = plain
    response = await client.http.post("/libretranslate/translate", data=form)
    assert response.status_code == 400, response.text
    assert "error" in response.json()


@pytest.mark.parametrize("text", ["12345", "https://example.com/a/b", "Bonjour tout le monde"])
async def test_a_detected_language_is_the_detectors_never_a_made_up_one(
    start_app: StartApp, fake: FakeControl, text: str
) -> None:
    client = await start_app(loader=fake.loader(), warmup=False)
    (detection,) = (await client.http.post("/detect", json={"texts": [text]})).json()
    deepl = await client.http.post("/v2/translate", json={"text": [text], "target_lang": "DE"})
    assert deepl.status_code == 200, deepl.text
    (translation,) = deepl.json()["translations"]
    assert (
        translation["detected_source_language"].lower().split("-")[0]
        == (detection["language"].lower().split("-")[0])
    )
    libre = await client.http.post(
        "/libretranslate/translate", json={"q": text, "source": "auto", "target": "de"}
    )
    assert libre.status_code == 200, libre.text
    detected = libre.json()["detectedLanguage"]
    assert detected["language"] == detection["language"]
    assert detected["confidence"] == round(detection["confidence"] * 100, 1)
