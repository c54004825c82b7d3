"""Google Cloud Translation's REST APIs (issue 38), in process: v2 and v3 shapes, the key in every
place Google's clients send it, stored glossaries in ``glossaryConfig``, and errors in Google's
shape whatever the body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config.settings import Settings
from tests.api.test_deepl_v3 import hy_mt2
from tests.conftest import KEYS, ServiceClient, StartApp, own_data, served
from tests.fakes import FakeControl

KEY = KEYS[0]
V3 = "/v3/projects/demo/locations/global"


def _google_error(answer: httpx.Response, status: int) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == status
    assert set(error) == {"code", "message", "errors", "status"}
    assert error["errors"][0]["domain"] == "global"


async def test_v2_translates_detects_and_names_languages(keyed: ServiceClient) -> None:
    http = keyed.http
    one = await http.get(
        "/language/translate/v2", params={"q": "Hello there", "target": "de", "key": KEY}
    )
    assert one.status_code == 200, one.text
    (translation,) = one.json()["data"]["translations"]
    assert set(translation) == {"translatedText", "detectedSourceLanguage"}
    assert translation["detectedSourceLanguage"] == "en"
    several = await http.post(
        "/language/translate/v2",
        json={"q": ["One.", "Two."], "target": "zh-TW", "source": "en", "format": "text"},
        headers={"X-Goog-Api-Key": KEY},
    )
    assert [set(t) for t in several.json()["data"]["translations"]] == [{"translatedText"}] * 2
    detected = await http.post(
        "/language/translate/v2/detect",
        json={"q": ["Guten Morgen, wie geht es dir?"]},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    ((detection,),) = detected.json()["data"]["detections"]
    assert detection["language"] == "de"
    assert 0 <= detection["confidence"] <= 1
    named = await http.get("/language/translate/v2/languages", params={"target": "de", "key": KEY})
    languages = {e["language"]: e["name"] for e in named.json()["data"]["languages"]}
    assert languages["en"] == "Englisch"
    assert languages["zh-CN"] == "Chinesisch"
    bare = await http.get("/language/translate/v2/languages", params={"key": KEY})
    assert all(set(e) == {"language"} for e in bare.json()["data"]["languages"])


async def test_v3_translates_detects_and_lists(keyed: ServiceClient) -> None:
    http = keyed.http
    headers = {"X-Goog-Api-Key": KEY}
    done = await http.post(
        f"{V3}:translateText",
        json={"contents": ["Hello."], "targetLanguageCode": "fr", "mimeType": "text/plain"},
        headers=headers,
    )
    assert done.status_code == 200, done.text
    assert done.json()["translations"][0]["detectedLanguageCode"] == "en"
    no_location = await http.post(
        "/v3/projects/demo:translateText",
        json={"contents": ["Hi."], "targetLanguageCode": "de", "sourceLanguageCode": "en"},
        headers=headers,
    )
    assert set(no_location.json()["translations"][0]) == {"translatedText"}
    detected = await http.post(
        f"{V3}:detectLanguage", json={"content": "Bonjour tout le monde"}, headers=headers
    )
    assert detected.json()["languages"][0]["languageCode"] == "fr"
    listed = await http.get(
        f"{V3}/supportedLanguages", params={"displayLanguageCode": "fr"}, headers=headers
    )
    first = listed.json()["languages"][0]
    assert set(first) == {"languageCode", "displayName", "supportSource", "supportTarget"}


async def test_keys_and_bad_bodies_get_google_s_errors(keyed: ServiceClient) -> None:
    http = keyed.http
    _google_error(await http.get("/language/translate/v2", params={"q": "x", "target": "de"}), 403)
    bad_key = {"q": "x", "target": "de", "key": "nope"}
    _google_error(await http.get("/language/translate/v2", params=bad_key), 403)
    headers = {"X-Goog-Api-Key": KEY}
    _google_error(await http.post("/language/translate/v2", json={"q": "x"}, headers=headers), 400)
    _google_error(
        await http.post("/language/translate/v2", json={"q": 3, "target": "de"}, headers=headers),
        400,
    )
    unknown = {"contents": ["x"], "targetLanguageCode": "tlh"}
    _google_error(await http.post(f"{V3}:translateText", json=unknown, headers=headers), 400)
    _google_error(await http.post(f"{V3}:translateText", content=b"{", headers=headers), 400)


async def test_more_texts_than_google_takes_in_one_request_get_its_400(
    keyed: ServiceClient,
) -> None:
    # Google's own limits (v2: 128 q's, "Too many text segments"; v3: 1,024 contents): a
    # probe's 2,000 q's in one v2 request were taken as one batch of 2,000 texts.
    http, headers = keyed.http, {"X-Goog-Api-Key": KEY}
    many = {"q": ["x"] * 129, "target": "de"}
    for path in ("/language/translate/v2", "/language/translate/v2/detect"):
        answer = await http.post(path, json=many, headers=headers)
        _google_error(answer, 400)
        assert "Too many text segments" in answer.json()["error"]["message"]
    contents = {"contents": ["x"] * 1025, "targetLanguageCode": "de"}
    _google_error(await http.post(f"{V3}:translateText", json=contents, headers=headers), 400)
    fits = await http.post(
        "/language/translate/v2/detect", json={"q": ["x"] * 128}, headers=headers
    )
    assert fits.status_code == 200, fits.text


async def test_glossary_config_takes_a_stored_glossary_s_pair(
    start_app: StartApp, tmp_path: Path, data_dir: Path
) -> None:
    client = await hy_mt2(start_app, tmp_path, data_dir)
    made = await client.http.post(
        "/v3/glossaries",
        headers={"Authorization": f"DeepL-Auth-Key {KEY}"},
        json={
            "name": "ops",
            "dictionaries": [{"source_lang": "en", "target_lang": "de", "entries": "node\tKnoten"}],
        },
    )
    glossary = f"projects/demo/locations/global/glossaries/{made.json()['glossary_id']}"
    body = {
        "contents": ["Restart the node."],
        "sourceLanguageCode": "en",
        "targetLanguageCode": "de",
        "glossaryConfig": {"glossary": glossary},
    }
    headers = {"X-Goog-Api-Key": KEY}
    done = await client.http.post(f"{V3}:translateText", json=body, headers=headers)
    assert done.status_code == 200, done.text
    assert set(done.json()) == {"translations", "glossaryTranslations"}
    wrong = {**body, "targetLanguageCode": "fr"}
    _google_error(await client.http.post(f"{V3}:translateText", json=wrong, headers=headers), 400)
    missing = {**body, "glossaryConfig": {"glossary": "projects/p/glossaries/none"}}
    _google_error(await client.http.post(f"{V3}:translateText", json=missing, headers=headers), 404)


ROUTES = [
    "/language/translate/v2",
    "/language/translate/v2/detect",
    "/language/translate/v2/languages",
    f"{V3}:translateText",
    f"{V3}:detectLanguage",
]
FIELDS = [
    "q", "target", "source", "format", "model", "cid", "contents", "content", "mimeType",
    "targetLanguageCode", "sourceLanguageCode", "glossaryConfig", "displayLanguageCode",
    "transliterationConfig", "labels",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["de", "en", "zh-TW", "html", "text/plain", "projects/p/glossaries/x"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=5)), inner, max_size=3),
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def google(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    fake = FakeControl(tmp_path_factory.mktemp("google-fake"))
    configured = Settings(
        _env_file=None,
        data_dir=own_data(data_dir, tmp_path_factory.mktemp("google") / "data"),
        warmup=False,
        api_keys=[KEY],
    )
    with served(configured, fake.loader()) as client:
        yield client


@pytest.mark.parametrize("path", ROUTES)
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(body=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6))
def test_no_google_route_fails_on_any_json(
    google: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    headers = {"content-type": "application/json", "x-goog-api-key": KEY}
    answer = google.post(path, content=json.dumps(body, allow_nan=True), headers=headers)
    assert answer.status_code < 500, (path, body, answer.text)
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert set(error) == {"code", "message", "errors", "status"}, (path, body, answer.text)
