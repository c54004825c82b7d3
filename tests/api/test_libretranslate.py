"""The LibreTranslate dialect's parity with LibreTranslate: the codes it advertises today, its
probe, "disabled" where a feature is off, ``Slowdown:`` on 429, untranslatable input answered as
it is; and the language spellings every dialect accepts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.config.settings import Settings
from tests.conftest import ServiceClient, StartApp, started
from tests.fakes import FakeControl

ROUTE = "/libretranslate/translate"


@pytest.fixture(scope="module")
async def fake_control(tmp_path_factory: pytest.TempPathFactory) -> FakeControl:
    return FakeControl(tmp_path_factory.mktemp("fake"))


@pytest.fixture(scope="module")
async def service(fake_control: FakeControl, data_dir: Path) -> AsyncIterator[ServiceClient]:
    settings = Settings(_env_file=None, data_dir=data_dir, warmup=False, cache_size=0)
    async with started(settings, fake_control.loader()) as client:
        yield client


@pytest.mark.parametrize(("source", "target"), [("en", "zh-Hans"), ("en", "zt"), ("en", "pb")])
async def test_the_codes_current_libretranslate_advertises_are_accepted(
    service: ServiceClient, source: str, target: str
) -> None:
    response = await service.http.post(
        ROUTE, json={"q": "Hello", "source": source, "target": target}
    )
    assert response.status_code == 200, response.text
    response = await service.http.post(ROUTE, json={"q": "Olá", "source": "pt-BR", "target": "en"})
    assert response.status_code == 200, response.text


async def test_probe_spec_files_and_disabled_features(service: ServiceClient) -> None:
    http = service.http
    health = await http.get("/libretranslate/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    spec = await http.get("/libretranslate/spec")
    assert "/translate" in spec.json()["paths"]
    # Files are served (tests/deploy/test_documents.py); without a file: 400 in its shape.
    files = await http.post("/libretranslate/translate_file", data={"source": "en"})
    assert files.status_code == 400
    assert "multipart" in files.json()["error"]
    upload = await http.post(
        "/libretranslate/translate_file",
        data={"source": "en", "target": "de"},
        files={"other": ("a.txt", b"Hi")},
    )
    assert upload.status_code == 400
    assert "missing file" in upload.json()["error"]
    suggest = await http.post("/libretranslate/suggest", json={"q": "a", "s": "b"})
    assert suggest.status_code == 403
    assert suggest.json() == {"error": "Suggestions are disabled on this server."}
    settings = (await http.get("/libretranslate/frontend/settings")).json()
    assert settings["filesTranslation"] is True
    assert ".docx" in settings["supportedFilesFormat"]
    assert settings["suggestions"] is False
    missing = await http.get("/libretranslate/nope")
    assert (missing.status_code, missing.json()) == (404, {"error": "Not found"})


@pytest.mark.parametrize("text", ["12345", "3.14 + 2 = 5.14", "😀🎉", "https://example.com/a?b=c"])
async def test_text_with_nothing_to_translate_comes_back_as_it_is(
    service: ServiceClient, fake_control: FakeControl, text: str
) -> None:
    before = fake_control.items_seen
    response = await service.http.post(ROUTE, json={"q": text, "source": "en", "target": "de"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == text
    both = await service.http.post(
        ROUTE, json={"q": [text, "Hello there"], "source": "en", "target": "de"}
    )
    translated = both.json()["translatedText"]
    assert translated[0] == text
    assert translated[1] != "Hello there"
    assert fake_control.items_seen == before + 1  # only "Hello there" reached the model


async def test_a_429_says_slowdown(start_app: StartApp, fake: FakeControl) -> None:
    client: ServiceClient = await start_app(loader=fake.loader(), warmup=False, max_queue_size=1)
    fake.hold()
    held = asyncio.create_task(
        client.http.post("/translate", json={"text": "a", "target_lang": "de"})
    )
    try:
        for _ in range(200):
            if client.runtime.admission.full:
                break
            await asyncio.sleep(0.01)
        refused = await client.http.post(ROUTE, json={"q": "b", "source": "en", "target": "de"})
        assert refused.status_code == 429
        assert refused.json()["error"].startswith("Slowdown: ")
    finally:
        fake.release()
        await held


@pytest.mark.parametrize(
    "code", ["zh-CN", "zh-Hans", "zh-TW", "zh-Hant-HK", "en-US", "pt-BR", "english", "English"]
)
async def test_native_api_accepts_the_spellings_clients_send(
    service: ServiceClient, code: str
) -> None:
    response = await service.http.post("/translate", json={"text": "Hallo", "target_lang": code})
    assert response.status_code == 200, response.text


async def test_an_unknown_code_gets_suggestions(service: ServiceClient) -> None:
    response = await service.http.post("/translate", json={"text": "Hallo", "target_lang": "engl"})
    assert response.status_code == 422
    assert "did you mean 'en'" in response.json()["error"]["message"]


async def test_an_uncertain_source_says_so(demo: ServiceClient) -> None:
    guess = await demo.http.post("/translate", json={"text": "Taxi", "target_lang": "de"})
    assert guess.json()["source_lang_uncertain"] is True
    sure = await demo.http.post(
        "/translate", json={"text": "Where is the nearest train station?", "target_lang": "de"}
    )
    assert sure.json()["source_lang_uncertain"] is False
    detected = await demo.http.post("/detect", json={"texts": ["Taxi", "안녕하세요"]})
    assert [d["uncertain"] for d in detected.json()] == [True, False]
