"""The LibreTranslate and DeepL dialects, driven by those services' official client libraries
(unchanged, pointed at a real server process on loopback) and by plain form posts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.error import HTTPError

import deepl
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.deploy.conftest import Process, start_service


@pytest.fixture(scope="module")
def keyed(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A service that requires keys and has a small character quota."""
    process = start_service(
        data_dir,
        tmp_path_factory.mktemp("keyed") / "service.log",
        HYMT_API_KEYS=json.dumps(["good-key", "quota-key"]),
        HYMT_CHAR_QUOTA="60/hour",
    )
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def no_deepl_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)


def test_libretranslatepy_translates_detects_and_lists(service: Process) -> None:
    lt = LibreTranslateAPI(f"{service.url}/libretranslate/")
    assert isinstance(lt.translate("Good morning", "en", "de"), str)
    detected = lt.detect("Bonjour tout le monde, comment allez-vous ?")
    assert detected[0]["language"] == "fr"
    assert 0 < detected[0]["confidence"] <= 100
    languages = lt.languages()
    assert {"code": "zh", "name": "Chinese"}.items() <= languages[0].items()
    assert len(languages) == 38


def test_libretranslate_form_posts_and_lists(service: Process) -> None:
    url = f"{service.url}/libretranslate/translate"
    single = httpx.post(url, data={"q": "Guten Tag", "source": "auto", "target": "en"})
    assert single.status_code == 200, single.text
    assert single.json()["detectedLanguage"]["language"] == "de"
    many = httpx.post(
        url,
        json={"q": ["Bonjour le monde", "今天天气很好"], "source": "auto", "target": "en"},
    )
    body = many.json()
    assert len(body["translatedText"]) == 2
    assert [d["language"] for d in body["detectedLanguage"]] == ["fr", "zh"]  # per text
    html = httpx.post(
        url,
        json={"q": "<p>Hello <b>world</b></p>", "source": "en", "target": "de", "format": "html"},
    )
    assert html.json()["translatedText"].startswith("<p>")
    assert "<b>" in html.json()["translatedText"]
    alternatives = httpx.post(
        url, json={"q": "Hello", "source": "en", "target": "de", "alternatives": 3}
    )
    answer = alternatives.json()
    # Sampled draws (the service decodes greedily here): distinct, none equal to the translation.
    assert 1 <= len(answer["alternatives"]) <= 3
    assert len(set(answer["alternatives"])) == len(answer["alternatives"])
    assert answer["translatedText"] not in answer["alternatives"]
    listed = httpx.post(
        url, json={"q": ["Hello", "12345"], "source": "en", "target": "de", "alternatives": 2}
    ).json()
    assert len(listed["alternatives"]) == 2
    assert listed["alternatives"][1] == []  # nothing to translate: no draws
    bad = httpx.post(url, json={"q": "Hello", "source": "en", "target": "xx"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"error"}
    settings = httpx.get(f"{service.url}/libretranslate/frontend/settings").json()
    assert settings["keyRequired"] is False


def test_libretranslatepy_surfaces_auth_errors(keyed: Process) -> None:
    with pytest.raises(HTTPError) as refused:
        LibreTranslateAPI(f"{keyed.url}/libretranslate/", api_key="wrong").translate(
            "Hello", "en", "de"
        )
    assert refused.value.code == 403
    refused.value.close()
    ok = LibreTranslateAPI(f"{keyed.url}/libretranslate/", api_key="good-key")
    assert isinstance(ok.translate("Hello", "en", "de"), str)


def test_deepl_library_translates_lists_languages_and_usage(service: Process) -> None:
    translator = deepl.Translator("any-key", server_url=service.url)
    result = translator.translate_text("Guten Morgen, wie geht es dir?", target_lang="EN-US")
    assert isinstance(result, deepl.TextResult)
    assert result.detected_source_lang == "DE"
    results = translator.translate_text(["Hello", "Bonjour tout le monde"], target_lang="ZH-HANS")
    assert isinstance(results, list)
    assert len(results) == 2
    assert results[1].detected_source_lang == "FR"
    html = translator.translate_text(
        "<p>Hello <i>there</i></p>", source_lang="EN", target_lang="DE", tag_handling="html"
    )
    assert isinstance(html, deepl.TextResult)
    assert html.text.startswith("<p>")
    assert any(language.code == "ZH-HANT" for language in translator.get_target_languages())
    assert any(language.code == "DE" for language in translator.get_source_languages())
    usage = translator.get_usage()
    assert usage.character.limit is not None
    with pytest.raises(deepl.DeepLException, match="formality"):
        translator.translate_text("Hello", target_lang="DE", formality="more")


def test_deepl_form_post_with_repeated_text(service: Process) -> None:
    response = httpx.post(
        f"{service.url}/v2/translate",
        data={"text": ["Hello", "World"], "target_lang": "DE"},
        headers={"Authorization": "DeepL-Auth-Key anything"},
    )
    assert response.status_code == 200, response.text
    translations = response.json()["translations"]
    assert [t["billed_characters"] for t in translations] == [5, 5]
    assert set(translations[0]) == {"detected_source_language", "text", "billed_characters"}
    big = httpx.post(
        f"{service.url}/v2/translate",
        json={"text": ["x" * 4000] * 40, "target_lang": "DE"},
    )
    assert big.status_code == 413
    assert "message" in big.json()


def test_deepl_library_surfaces_auth_and_quota_errors(keyed: Process) -> None:
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong-key", server_url=keyed.url).translate_text("Hi", target_lang="DE")
    translator = deepl.Translator("quota-key", server_url=keyed.url)
    translator.translate_text("x" * 50, target_lang="DE")
    assert translator.get_usage().character.count == 50
    with pytest.raises(deepl.QuotaExceededException):
        translator.translate_text("y" * 20, target_lang="DE")
