"""Google Cloud Translation through the unmodified ``google-cloud-translate`` clients against a
real service process (issue 38): the v2 ``Client`` and the v3 ``TranslationServiceClient`` over
REST, each pointed at the service with ``client_options``; a bad key gets Google's 403 and a
malformed request Google's 400, as the clients raise them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.auth import api_key
from google.cloud import translate_v3
from google.cloud.translate_v2 import Client as V2Client  # type: ignore[import-untyped]

from tests.deploy.conftest import Process, start_service

KEY = "google-key"
PARENT = "projects/demo/locations/global"


@pytest.fixture(scope="module")
def google(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    process = start_service(
        data_dir,
        tmp_path_factory.mktemp("google") / "service.log",
        HYMT_API_KEYS=json.dumps([KEY]),
    )
    yield process
    process.stop()


def _v2(url: str, key: str = KEY) -> V2Client:
    return V2Client(
        credentials=api_key.Credentials(key),  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": url},
    )


def _v3(url: str, key: str = KEY) -> translate_v3.TranslationServiceClient:
    return translate_v3.TranslationServiceClient(
        transport="rest", client_options={"api_endpoint": url, "api_key": key}
    )


def test_the_v2_client_translates_detects_and_lists(google: Process) -> None:
    client = _v2(google.url)
    one = client.translate("Good morning, everyone.", target_language="de")
    assert one["translatedText"]
    assert one["detectedSourceLanguage"] == "en"
    several = client.translate(
        ["One.", "Two."], target_language="zh-CN", source_language="en", format_="text"
    )
    assert [t["input"] for t in several] == ["One.", "Two."]
    detected = client.detect_language("Bonjour tout le monde, comment allez-vous ?")
    assert detected["language"] == "fr"
    languages = {entry["language"]: entry["name"] for entry in client.get_languages("fr")}
    assert languages["de"] == "allemand"
    with pytest.raises(exceptions.Forbidden):
        _v2(google.url, "wrong-key").translate("x", target_language="de")
    with pytest.raises(exceptions.BadRequest):
        client.translate("x", target_language="not-a-language")


def test_the_v3_client_translates_detects_and_lists(google: Process) -> None:
    client = _v3(google.url)
    done = client.translate_text(
        request={
            "parent": PARENT,
            "contents": ["Good morning.", "Thank you."],
            "target_language_code": "ja",
            "mime_type": "text/plain",
        }
    )
    assert len(done.translations) == 2
    assert done.translations[0].detected_language_code == "en"
    detected = client.detect_language(
        request={"parent": "projects/demo", "content": "Guten Morgen, wie geht es Ihnen?"}
    )
    assert detected.languages[0].language_code == "de"
    supported = client.get_supported_languages(
        request={"parent": PARENT, "display_language_code": "de"}
    )
    names = {language.language_code: language.display_name for language in supported.languages}
    assert names["fr"] == "Französisch"
    with pytest.raises(exceptions.Forbidden):
        _v3(google.url, "wrong-key").translate_text(
            request={"parent": PARENT, "contents": ["x"], "target_language_code": "de"}
        )
    with pytest.raises(exceptions.BadRequest):
        client.translate_text(request={"parent": PARENT, "contents": ["x"]})
