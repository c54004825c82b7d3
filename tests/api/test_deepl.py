"""The DeepL dialect's parity with DeepL's API v2: language lists as the official clients expect
them, options validated in DeepL's wording, every way of sending the key, usage counted, tags
left alone, unknown routes in DeepL's shape."""

from __future__ import annotations

import asyncio
import urllib.parse

import pytest

from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl

KEY = {"Authorization": "DeepL-Auth-Key k"}


async def translate(client: ServiceClient, **params: object) -> tuple[int, dict[str, object]]:
    response = await client.http.post("/v2/translate", json=params, headers=KEY)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert isinstance(body, dict)
    return response.status_code, body


@pytest.mark.parametrize("way", ["query", "form", "json"])
async def test_target_languages_list_the_variants_the_official_clients_accept(
    keyed: ServiceClient, way: str
) -> None:
    if way == "query":
        response = await keyed.http.get("/v2/languages?type=target", headers=KEY)
    elif way == "form":  # deepl-python sends the type in a form body
        response = await keyed.http.post("/v2/languages", data={"type": "target"}, headers=KEY)
    else:
        response = await keyed.http.post("/v2/languages", json={"type": "target"}, headers=KEY)
    assert response.status_code == 200, response.text
    entries = response.json()
    codes = {entry["language"] for entry in entries}
    assert {"EN-US", "EN-GB", "PT-BR", "PT-PT", "ZH", "ZH-HANS", "ZH-HANT", "DE"} <= codes
    assert not {"EN", "PT"} & codes  # deprecated as targets: the official clients refuse them
    assert all(entry["supports_formality"] is False for entry in entries)


async def test_source_languages_have_one_code_per_language(keyed: ServiceClient) -> None:
    response = await keyed.http.get("/v2/languages", headers=KEY)
    codes = [entry["language"] for entry in response.json()]
    assert {"EN", "PT", "ZH", "DE"} <= set(codes)
    assert not {"EN-US", "ZH-HANT", "ZH-HANS"} & set(codes)
    assert len(codes) == len(set(codes))
    bad = await keyed.http.get("/v2/languages?type=both", headers=KEY)
    assert bad.status_code == 400
    assert bad.json() == {
        "message": "Parameter 'type' is invalid. 'source' and 'target' are valid values."
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"target_lang": "DE"}, "Parameter 'text' not specified."),
        ({"text": []}, "Parameter 'text' not specified."),
        ({"text": ["a"]}, "Parameter 'target_lang' not specified."),
        ({"text": ["a"], "target_lang": "XX"}, "Value for 'target_lang' not supported."),
        ({"text": ["a"], "target_lang": "DE", "source_lang": "EN-XX-1"}, None),
        (
            {"text": ["a"], "target_lang": "DE", "source_lang": "QQ"},
            "Value for 'source_lang' not supported.",
        ),
        (
            {"text": ["a"], "target_lang": "DE", "split_sentences": "invalid"},
            "Value for 'split_sentences' not supported.",
        ),
        (
            {"text": ["a"], "target_lang": "DE", "tag_handling": "pdf"},
            "Value for 'tag_handling' not supported.",
        ),
        (
            {"text": ["a"], "target_lang": "DE", "formality": "very"},
            "Value for 'formality' not supported.",
        ),
        (
            {"text": ["a"], "target_lang": "DE", "formality": "more"},
            "'formality' is not supported for given 'target_lang'.",
        ),
        (
            {"text": [1], "target_lang": "DE"},
            "Value for 'text' not supported.",
        ),
    ],
)
async def test_invalid_options_get_deepls_own_message(
    keyed: ServiceClient, params: dict[str, object], message: str | None
) -> None:
    status, body = await translate(keyed, **params)
    if message is None:  # a region subtag of a language there is: accepted
        assert status == 200, body
        return
    assert status == 400
    assert body == {"message": message}


async def test_safe_options_are_accepted_and_model_type_is_answered(keyed: ServiceClient) -> None:
    status, body = await translate(
        keyed,
        text=["Hello"],
        target_lang="EN-GB",
        formality="prefer_more",
        split_sentences="nonewlines",
        preserve_formatting=True,
        model_type="prefer_quality_optimized",
    )
    assert status == 200, body
    translations = body["translations"]
    assert isinstance(translations, list)
    assert translations[0]["model_type_used"] == "quality_optimized"
    status, body = await translate(keyed, text=["Hello"], target_lang="ZH-HANT", formality="less")
    assert status == 400  # DeepL refuses formality for a target without it
    status, body = await translate(keyed, text=["Hello"], target_lang="PT")
    assert status == 200  # deprecated, still answered
    translations = body["translations"]
    assert isinstance(translations, list)
    assert "model_type_used" not in translations[0]


async def test_every_way_of_sending_the_key(keyed: ServiceClient) -> None:
    http = keyed.http
    body = {"text": "Hello", "target_lang": "DE"}
    bearer = await http.post("/v2/translate", json=body, headers={"Authorization": "Bearer k"})
    assert bearer.status_code == 200, bearer.text
    legacy = await http.post("/v2/translate", data={**body, "auth_key": "k"})
    assert legacy.status_code == 200, legacy.text
    # deep-translator: GET with the key and the text in the query.
    query = await http.get(
        "/v2/translate", params={"text": ["Hello", "World"], "target_lang": "DE", "auth_key": "k"}
    )
    assert query.status_code == 200, query.text
    assert len(query.json()["translations"]) == 2
    missing = await http.post("/v2/translate", json=body)
    assert missing.status_code == 403
    assert "DeepL-Auth-Key" in missing.json()["message"]
    wrong = await http.post("/v2/translate", json=body, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 403
    assert set(wrong.json()) == {"message"}


async def test_a_form_over_starlette_s_limits_says_which(keyed: ServiceClient) -> None:
    # A probe's 3,000 text fields got "the form body cannot be parsed" and nothing more; the
    # limit Starlette refused it for (1,000 fields) is safe to name, in DeepL's shape.
    headers = {
        "Authorization": "DeepL-Auth-Key k",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    fields = urllib.parse.urlencode([("text", "hi")] * 1001 + [("target_lang", "DE")])
    answer = await keyed.http.post("/v2/translate", content=fields, headers=headers)
    assert answer.status_code == 400
    assert set(answer.json()) == {"message"}
    assert "Too many fields" in answer.json()["message"]


async def test_usage_counts_characters_without_a_quota(keyed: ServiceClient) -> None:
    headers = {"Authorization": "DeepL-Auth-Key k2"}
    before = (await keyed.http.get("/v2/usage", headers=headers)).json()
    await keyed.http.post(
        "/v2/translate", json={"text": ["Hello", "World!"], "target_lang": "DE"}, headers=headers
    )
    after = (await keyed.http.get("/v2/usage", headers=headers)).json()
    assert after["character_count"] - before["character_count"] == 11
    assert after["character_limit"] == 10**12


async def test_ignored_tags_and_translate_no_are_left_as_written(keyed: ServiceClient) -> None:
    status, body = await translate(
        keyed,
        text=['<p>Run <code>make test</code> now.</p><p translate="no">Hunyuan <b>MT</b></p>'],
        target_lang="DE",
        tag_handling="xml",
        ignore_tags="code,pre",
    )
    assert status == 200, body
    translations = body["translations"]
    assert isinstance(translations, list)
    text = translations[0]["text"]
    assert "<code>make test</code>" in text
    assert '<p translate="no">Hunyuan <b>MT</b></p>' in text
    assert "Run" not in text  # the rest was translated (the fake engine answers "out:N")


async def test_unknown_routes_and_methods_answer_in_deepls_shape(keyed: ServiceClient) -> None:
    missing = await keyed.http.get("/v2/glossaries-nope", headers=KEY)
    assert missing.status_code == 404
    assert missing.json() == {"message": "Not found"}
    method = await keyed.http.delete("/v2/translate", headers=KEY)
    assert method.status_code == 405
    assert set(method.json()) == {"message"}


@pytest.mark.parametrize(
    ("answer", "generations", "expected"),
    [
        # The model kept the inline tags: the sentence was translated whole.
        ("Hallo <b>Welt</b> heute", 1, "<p>Hallo <b>Welt</b> heute</p>"),
        # It lost them: the pieces between the tags are translated instead, tags kept.
        ("Hallo", 4, "<p>Hallo <b>Hallo</b> Hallo</p>"),
    ],
)
async def test_inline_tags_do_not_split_a_sentence(
    start_app: StartApp, fake: FakeControl, answer: str, generations: int, expected: str
) -> None:
    client = await start_app(loader=fake.loader(answer=answer), cache_size=0)
    before = fake.items_seen
    response = await client.http.post(
        "/v2/translate",
        json={
            "text": ["<p>Hello <b>world</b> today</p>"],
            "target_lang": "DE",
            "tag_handling": "html",
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["text"] == expected
    assert fake.items_seen - before == generations
    # splitting_tags puts the split back for a tag: three pieces, three generations.
    before = fake.items_seen
    split = await client.http.post(
        "/v2/translate",
        json={
            "text": ["<p>Hello <b>world</b> today</p>"],
            "target_lang": "DE",
            "tag_handling": "html",
            "splitting_tags": "b",
        },
    )
    assert split.status_code == 200, split.text
    assert fake.items_seen - before == 3


async def test_a_document_is_uploaded_polled_and_downloaded_once(keyed: ServiceClient) -> None:
    auth = KEY
    srt = "1\n00:00:01,000 --> 00:00:02,000\nHello there.\n"
    upload = await keyed.http.post(
        "/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("talk.srt", srt.encode())},
        headers=auth,
    )
    assert upload.status_code == 200, upload.text
    job = upload.json()
    key = {"document_key": job["document_key"]}
    for _ in range(200):
        status = await keyed.http.post(f"/v2/document/{job['document_id']}", json=key, headers=auth)
        if status.json()["status"] == "done":
            break
        await asyncio.sleep(0.02)
    assert status.json() == {
        "document_id": job["document_id"],
        "status": "done",
        "billed_characters": len("Hello there."),
    }
    result = await keyed.http.post(
        f"/v2/document/{job['document_id']}/result", json=key, headers=auth
    )
    assert result.status_code == 200
    assert result.text.startswith("1\n00:00:01,000 --> 00:00:02,000\nout:")  # the fake's answer
    again = await keyed.http.post(
        f"/v2/document/{job['document_id']}/result", json=key, headers=auth
    )
    assert again.status_code == 404
    assert "once" in again.json()["message"]
    missing = await keyed.http.post("/v2/document", data={"target_lang": "DE"}, headers=auth)
    assert missing.status_code == 400
    assert "multipart" in missing.json()["message"]
    no_key = await keyed.http.post(f"/v2/document/{job['document_id']}", json={}, headers=auth)
    assert no_key.status_code == 400
    assert no_key.json() == {"message": "Parameter 'document_key' not specified."}
