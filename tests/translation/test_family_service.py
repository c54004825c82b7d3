"""Each turn format's demo model through HTTP: the family's options, /prompt, refusals."""

from __future__ import annotations

import pytest

from service.frontend.translation.detection import Detection, target_mismatch
from service.frontend.translation.languages import LanguageTable
from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl

HY_BEGIN = "<｜hy_begin▁of▁sentence｜><｜hy_User｜>"
# Where each turn format puts the user's prompt: what /prompt must show around it.
FORMATS = {
    "hunyuan-mt 7b": ("<|startoftext|>", "<|extra_0|>"),
    "hy-mt1.5 1.8b": (HY_BEGIN, "<｜hy_place▁holder▁no▁8｜>"),  # no generation prompt
    "hy-mt2 1.8b": (HY_BEGIN, "<｜hy_Assistant｜>"),
    "hy-mt2 7b": ("<|startoftext|>", "<|extra_0|>"),
    "hy-mt2 30b-a3b": (HY_BEGIN, "<｜hy_Assistant｜>"),
}


async def _check_chat_format(client: ServiceClient, model: str) -> None:
    """/prompt shows the turn format around the prompt and counts what /translate sends."""
    begins, ends = FORMATS[model]
    body = {"text": "Good morning", "target_lang": "de", "source_lang": "en"}
    shown = await client.http.post("/prompt", json=body)
    assert shown.status_code == 200, shown.text
    prompt = shown.json()["prompt"]
    assert prompt.startswith(begins)
    assert prompt.endswith(ends)
    assert "German" in prompt
    assert "Good morning" in prompt
    translated = await client.http.post("/translate", json=body)
    assert translated.status_code == 200, translated.text
    assert translated.json()["usage"]["input_tokens"] == shown.json()["input_tokens"]


@pytest.mark.parametrize("size", ["1.8b", "7b", "30b-a3b"])  # the three turn formats
async def test_hy_mt2_options_and_a_glossary_through_http(start_app: StartApp, size: str) -> None:
    client: ServiceClient = await start_app(
        model_family="hy-mt2", model_size=size, max_new_tokens=4, warmup=False
    )
    await _check_chat_format(client, f"hy-mt2 {size}")
    base = {"text": "Deploy the service.", "target_lang": "zh", "source_lang": "en"}
    options: list[dict[str, object]] = [
        {"glossary": {"service": "服务", "deploy": "部署"}},
        {"context": "An operations manual."},
        {"style": "formal"},
        {"preferences": ["Keep it short", "No English words"]},
        {"format": "json"},
        {"delimiter": "@@"},
    ]
    prompts = set()
    for option in options:
        shown = await client.http.post("/prompt", json={**base, **option})
        assert shown.status_code == 200, shown.text
        prompts.add(shown.json()["prompt"])
        done = await client.http.post("/translate", json={**base, **option})
        assert done.status_code == 200, done.text
        assert done.headers["x-cache"] == "miss"  # each option is its own cache entry
    assert len(prompts) == len(options)
    assert "service 翻译成 服务\ndeploy 翻译成 部署" in "".join(prompts)
    refused = await client.http.post("/translate", json={**base, "format": "markup"})
    assert refused.status_code == 422
    assert "format" in refused.json()["error"]["message"]
    # The random demo model loses the delimiters: the pieces are translated one by one instead.
    delimited = await client.http.post(
        "/translate", json={**base, "text": "Start@@ Stop @@Wait", "delimiter": "@@"}
    )
    assert delimited.status_code == 200, delimited.text
    pieces = delimited.json()["translation"].split("@@")
    assert len(pieces) == 3
    assert pieces[1].startswith(" ")
    assert pieces[1].endswith(" ")
    both = await client.http.post("/translate", json={**base, "style": "formal", "context": "x"})
    assert both.status_code == 422
    batch = await client.http.post(
        "/batch_translate",
        json={"texts": ["One.", "Two."], "target_lang": "de", "glossary": {"One": "Eins"}},
    )
    assert batch.status_code == 200, batch.text
    # A stored glossary (the DeepL routes), used by id, then deleted.
    created = await client.http.post(
        "/v2/glossaries",
        json={
            "name": "ops",
            "source_lang": "en",
            "target_lang": "zh",
            "entries": "service\t服务\n",
            "entries_format": "tsv",
        },
    )
    assert created.status_code == 201, created.text
    glossary_id = created.json()["glossary_id"]
    used = await client.http.post("/prompt", json={**base, "glossary_id": glossary_id})
    assert "service 翻译成 服务" in used.json()["prompt"]
    translated = await client.http.post("/translate", json={**base, "glossary_id": glossary_id})
    assert translated.status_code == 200, translated.text
    assert (await client.http.delete(f"/v2/glossaries/{glossary_id}")).status_code == 204
    gone = await client.http.post("/translate", json={**base, "glossary_id": glossary_id})
    assert gone.status_code == 404


async def test_hy_mt15_markup_and_hunyuan_refusals(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(
        model_family="hy-mt1.5", model_size="1.8b", max_new_tokens=4, warmup=False
    )
    await _check_chat_format(client, "hy-mt1.5 1.8b")
    body = {"text": "<p>Hello <b>world</b></p>", "target_lang": "zh", "format": "markup"}
    shown = await client.http.post("/prompt", json=body)
    assert "<source><s1>Hello <s2>world</s2></s1></source>" in shown.json()["prompt"]
    done = await client.http.post("/translate", json=body)
    assert done.status_code == 200, done.text
    plain: ServiceClient = await start_app(warmup=False)
    await _check_chat_format(plain, "hunyuan-mt 7b")
    refused = await plain.http.post(
        "/translate", json={"text": "Hi", "target_lang": "de", "glossary": {"Hi": "Hallo"}}
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["message"].startswith("glossary: not supported")


async def test_a_translation_in_the_wrong_language_is_flagged_and_counted(
    start_app: StartApp, fake: FakeControl
) -> None:
    german = "Das Wetter ist heute sehr schön und wir gehen im Park spazieren."
    client: ServiceClient = await start_app(loader=fake.loader(answer=german), cache_size=0)
    wrong = await client.http.post(
        "/translate",
        json={"text": "The weather is nice.", "target_lang": "ja", "source_lang": "en"},
    )
    assert wrong.status_code == 200, wrong.text
    assert wrong.json()["target_language_mismatch"] is True
    right = await client.http.post(
        "/batch_translate",
        json={"texts": ["The weather is nice.", "12345"], "target_lang": "de", "source_lang": "en"},
    )
    assert [t["target_language_mismatch"] for t in right.json()["translations"]] == [False, False]
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_target_language_mismatches_total{target="ja"} 1.0' in metrics


def test_short_texts_and_alike_languages_are_not_mismatches() -> None:
    languages = LanguageTable()
    zh, hant, de = languages["zh"], languages["zh-Hant"], languages["de"]
    sure = 0.99
    assert not target_mismatch("Hallo", de, Detection(languages["en"], sure))  # too short
    assert not target_mismatch("今天天气很好，我们去公园散步吧。", hant, Detection(zh, sure))
    long_text = "This sentence is long enough to be judged."
    assert target_mismatch(long_text, de, Detection(languages["en"], sure))
    assert not target_mismatch(long_text, de, Detection(languages["en"], 0.5))  # not sure


async def test_the_generation_prompt_can_be_turned_on_for_hy_mt15(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(
        model_family="hy-mt1.5", model_size="1.8b", add_generation_prompt="on", warmup=False
    )
    shown = await client.http.post("/prompt", json={"text": "Hi there", "target_lang": "de"})
    assert shown.json()["prompt"].endswith("Hi there<｜hy_Assistant｜>")
