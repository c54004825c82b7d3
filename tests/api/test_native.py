"""The native API through HTTP, on the serving engine with the demo model."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.config.settings import Settings
from tests.conftest import ServiceClient, StartApp, started
from tests.fakes import FakeControl


async def test_translate_returns_translation_languages_and_usage(demo: ServiceClient) -> None:
    started = time.perf_counter()
    response = await demo.http.post(
        "/translate", json={"text": "Good morning", "target_lang": "de", "source_lang": "en"}
    )
    took_ms = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {
        "translation",
        "source_lang",
        "detected_confidence",
        "source_lang_uncertain",
        "target_lang",
        "target_language_mismatch",
        "usage",
    }
    assert body["detected_confidence"] is None  # given, not detected
    assert body["source_lang_uncertain"] is False
    assert isinstance(body["translation"], str)
    assert body["source_lang"] == "en"
    assert body["target_lang"] == "de"
    assert body["usage"]["input_tokens"] > 0
    assert body["usage"]["output_tokens"] > 0
    assert response.headers["x-request-id"]
    # Where the time went: both parts inside the time the request took.
    queued = float(response.headers["x-queue-time-ms"])
    generating = float(response.headers["x-inference-time-ms"])
    assert generating > 0
    assert queued + generating <= took_ms
    assert response.headers["x-cache"] == "miss"


async def test_language_codes_are_case_insensitive(demo: ServiceClient) -> None:
    response = await demo.http.post(
        "/translate", json={"text": "Hello", "target_lang": "ZH-hant", "source_lang": "EN"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["target_lang"] == "zh-Hant"
    assert response.json()["source_lang"] == "en"


async def test_source_language_is_detected_per_text(demo: ServiceClient) -> None:
    response = await demo.http.post(
        "/translate", json={"text": "今天天气很好", "target_lang": "en"}
    )
    assert response.status_code == 200
    assert response.json()["source_lang"] == "zh"
    assert 0 < response.json()["detected_confidence"] <= 1
    batch = await demo.http.post(
        "/batch_translate",
        json={
            "texts": ["Bonjour tout le monde, comment allez-vous ?", "Guten Morgen, wie geht es?"],
            "target_lang": "en",
            "source_lang": "auto",
        },
    )
    assert [item["source_lang"] for item in batch.json()["translations"]] == ["fr", "de"]


async def test_detect_route(demo: ServiceClient) -> None:
    response = await demo.http.post(
        "/detect", json={"texts": ["Привет, как дела?", "東京は日本の首都です", "བོད་ཡིག"]}
    )
    assert response.status_code == 200
    assert [item["language"] for item in response.json()] == ["ru", "ja", "bo"]


async def test_batch_keeps_input_order_and_matches_single_results(demo: ServiceClient) -> None:
    texts = [
        "A short one.",
        "A considerably longer sentence that needs many more tokens than the others do.",
        "Mid-sized text here.",
        "今天天气很好",
    ]
    batch = await demo.http.post("/batch_translate", json={"texts": texts, "target_lang": "fr"})
    assert batch.status_code == 200, batch.text
    items = batch.json()["translations"]
    assert len(items) == len(texts)
    singles = [
        (await demo.http.post("/translate", json={"text": t, "target_lang": "fr"})).json()
        for t in texts
    ]
    # Greedy decoding: each batch item is what the same text gives alone (served here from
    # the cache the batch filled, so the order of results is what is checked).
    assert [i["translation"] for i in items] == [s["translation"] for s in singles]
    assert [i["usage"] for i in items] == [s["usage"] for s in singles]
    usage = batch.json()["usage"]
    assert usage["input_tokens"] == sum(i["usage"]["input_tokens"] for i in items)
    assert usage["output_tokens"] == sum(i["usage"]["output_tokens"] for i in items)


async def test_repeated_request_is_a_cache_hit(demo: ServiceClient) -> None:
    payload = {"text": "Cache me if you can", "target_lang": "es"}
    first = await demo.http.post("/translate", json=payload)
    second = await demo.http.post("/translate", json=payload)
    assert first.headers["x-cache"] == "miss"
    assert second.headers["x-cache"] == "hit"
    assert second.json() == first.json()
    assert float(second.headers["x-inference-time-ms"]) == 0
    metrics = (await demo.http.get("/metrics")).text
    hits = next(line for line in metrics.splitlines() if line.startswith("hymt_cache_hits_total"))
    assert float(hits.split()[1]) >= 1


async def test_languages_lists_the_38_model_card_languages(demo: ServiceClient) -> None:
    response = await demo.http.get("/languages")
    assert response.status_code == 200
    codes = {entry["code"] for entry in response.json()}
    assert len(codes) == 38
    assert {"zh", "en", "zh-Hant", "yue", "ug"} <= codes
    english = next(entry for entry in response.json() if entry["code"] == "en")
    assert english == {"code": "en", "name": "English", "chinese_name": "英语"}


async def test_health_is_ready_after_warm_up_and_live_route_answers(
    demo: ServiceClient,
) -> None:
    health = await demo.http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ready"
    assert health.json()["model"].startswith("hunyuan-mt-demo")
    assert health.json()["engine"] == "fast"  # no engine setting: the fast engine, on a CPU
    live = await demo.http.get("/live")
    assert live.status_code == 200
    # Liveness says only that the process lives and what its engine is doing.
    assert live.json() == {"status": "alive", "engine_state": "ready", "in_flight": 0}


async def test_metrics_exposes_the_service_series(demo: ServiceClient) -> None:
    await demo.http.post("/translate", json={"text": "Count me", "target_lang": "it"})
    response = await demo.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for series in (
        'hymt_requests_total{method="POST",route="/translate",status="200"}',
        "hymt_queue_wait_seconds_count",
        "hymt_batch_size_count",
        "hymt_inference_duration_seconds_count",
        "hymt_generated_tokens_total",
        "hymt_cache_misses_total",
        "hymt_model_load_seconds",
        "hymt_queue_depth",
        "hymt_ready 1.0",
    ):
        assert series in text, series


async def test_openapi_docs_are_served(demo: ServiceClient) -> None:
    assert (await demo.http.get("/docs")).status_code == 200
    document = (await demo.http.get("/openapi.json")).json()
    paths = document["paths"]
    assert {"/translate", "/batch_translate", "/health", "/languages"} <= set(paths)
    assert {"/translate/stream", "/prompt"} <= set(paths)
    target = document["components"]["schemas"]["TranslateRequest"]["properties"]["target_lang"]
    listed = target["anyOf"][0]["enum"]  # the codes, for generated clients and fuzzers
    assert len(listed) == 38
    assert "zh-Hant" in listed


async def test_a_form_body_is_told_to_send_json(demo: ServiceClient) -> None:
    response = await demo.http.post("/translate", data={"text": "hello", "target_lang": "de"})
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("send the body as JSON")


async def test_request_id_is_echoed_when_given(demo: ServiceClient) -> None:
    response = await demo.http.get("/health", headers={"X-Request-ID": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    bad = await demo.http.get("/health", headers={"X-Request-ID": "bad id\twith spaces"})
    assert bad.headers["x-request-id"] != "bad id\twith spaces"


async def test_health_is_503_until_the_model_is_ready(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(load_s=1.5), wait=False)
    loading = await client.http.get("/health")
    assert loading.status_code == 503
    assert loading.json()["error"]["code"] == "not_ready"
    assert loading.headers["retry-after"]
    assert (await client.http.get("/live")).status_code == 200
    refused = await client.http.post("/translate", json={"text": "x", "target_lang": "de"})
    assert refused.status_code == 503
    await client.runtime.wait_started()
    assert (await client.http.get("/health")).status_code == 200


@pytest.mark.parametrize(
    ("payload", "route", "fragment"),
    [
        ({"text": "", "target_lang": "de"}, "/translate", "text"),
        ({"text": "   ", "target_lang": "de"}, "/translate", "text: the text is empty"),
        ({"text": "hi", "target_lang": "xx"}, "/translate", "target_lang"),
        (
            {"text": "hi", "target_lang": "de", "source_lang": "klingon"},
            "/translate",
            "source_lang",
        ),
        ({"text": "hi"}, "/translate", "target_lang"),
        ({"text": "hi", "target_lang": "de", "debug": True}, "/translate", "debug"),
        ({"texts": [], "target_lang": "de"}, "/batch_translate", "texts"),
        ({"texts": ["ok", "ok", ""], "target_lang": "de"}, "/batch_translate", "texts[2]"),
        ({"texts": ["ok", " \n "], "target_lang": "de"}, "/batch_translate", "texts[1]"),
    ],
)
async def test_invalid_input_is_422_in_the_error_shape(
    demo: ServiceClient, payload: dict[str, object], route: str, fragment: str
) -> None:
    response = await demo.http.post(route, json=payload)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"}
    assert set(error) == {"code", "message"}
    assert fragment in error["message"]


@pytest.fixture(scope="module")
async def limited(data_dir: Path) -> AsyncIterator[ServiceClient]:
    """One demo service with every input limit set low, shared by the limit tests (each
    request trips only the limit its test is about)."""
    settings = Settings(
        _env_file=None,
        data_dir=data_dir,
        greedy=True,
        max_text_chars=50,
        max_document_chars=60,
        max_input_tokens=8,
        max_batch_items=3,
        max_body_bytes=2048,
        # A text cut into segments of eight tokens is ten texts: on a loaded 2-core machine the
        # demo's measured steps would make admission refuse them as too many for 100 s.
        request_timeout_s=1000.0,
    )
    async with started(settings) as client:
        yield client


async def test_text_over_character_limit_is_422(limited: ServiceClient) -> None:
    response = await limited.http.post("/translate", json={"text": "x" * 61, "target_lang": "de"})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "text_too_long"
    assert "at most 60 for a document" in response.json()["error"]["message"]
    # Over a text's characters and within a document's, even without a space: cut and translated.
    cut = await limited.http.post("/translate", json={"text": "x" * 60, "target_lang": "de"})
    assert cut.status_code == 200, cut.text
    batch = await limited.http.post(
        "/batch_translate", json={"texts": ["fine", "y" * 61], "target_lang": "de"}
    )
    assert batch.status_code == 422
    assert "texts[1]: 61 characters, at most 60" in batch.json()["error"]["message"]
    within = await limited.http.post(
        "/batch_translate", json={"texts": ["fine", "y" * 60], "target_lang": "de"}
    )
    assert within.status_code == 200, within.text
    assert len(within.json()["translations"]) == 2


async def test_a_text_over_the_token_limit_is_cut_into_segments(limited: ServiceClient) -> None:
    # 41 characters (under the character limit), more than eight tokens: a dense script's case.
    text = "several words make more than eight tokens"
    response = await limited.http.post("/translate", json={"text": text, "target_lang": "de"})
    assert response.status_code == 200, response.text  # translated as segments of few tokens
    batch = await limited.http.post(
        "/batch_translate", json={"texts": ["fine", text, "also fine"], "target_lang": "de"}
    )
    assert batch.status_code == 200, batch.text
    translations = batch.json()["translations"]
    assert len(translations) == 3
    assert translations[1]["translation"] == response.json()["translation"]
    streamed = await limited.http.post(
        "/translate/stream", json={"text": text, "target_lang": "de"}
    )
    assert streamed.status_code == 200, streamed.text
    last = streamed.text.strip().split("\n\n")[-1].splitlines()
    assert last[0] == "event: done", streamed.text
    assert (
        json.loads(last[1].removeprefix("data: "))["translation"] == translations[1]["translation"]
    )


async def test_batch_over_its_size_limit_is_422(limited: ServiceClient) -> None:
    response = await limited.http.post(
        "/batch_translate", json={"texts": ["a", "b", "c", "d"], "target_lang": "de"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "batch_too_large"


async def test_oversized_body_is_413(limited: ServiceClient) -> None:
    big = {"text": "x" * 4096, "target_lang": "de"}
    response = await limited.http.post("/translate", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.headers["x-request-id"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 1024

    streamed = await limited.http.post(
        "/translate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413


async def test_unknown_route_and_bad_json_use_the_error_shape(demo: ServiceClient) -> None:
    missing = await demo.http.get("/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    broken = await demo.http.post(
        "/translate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422
    assert broken.json()["error"]["code"] == "validation_error"


async def test_metrics_label_each_dialect_by_its_own_route(demo: ServiceClient) -> None:
    await demo.http.post(
        "/libretranslate/translate", json={"q": "hi", "source": "en", "target": "de"}
    )
    await demo.http.post("/v2/translate", json={"text": ["hi"], "target_lang": "DE"})
    text = (await demo.http.get("/metrics")).text
    assert 'route="/libretranslate/translate"' in text
    assert 'route="/v2/translate"' in text


async def test_metrics_say_how_busy_the_engine_kept_its_accelerator(
    start_app: StartApp, fake: FakeControl, demo: ServiceClient
) -> None:
    # An engine whose accelerator works a quarter of the time: the heartbeat's share reaches
    # the gauge, labelled with the device. The demo model on this CPU times nothing: absent.
    client = await start_app(loader=fake.loader(device_busy=0.25))
    found = None
    for _ in range(50):
        text = (await client.http.get("/metrics")).text
        found = re.search(r'^hymt_engine_device_busy_ratio\{device="cpu"\} (\S+)$', text, re.M)
        if found:
            break
        await asyncio.sleep(0.1)
    assert found is not None
    assert 0.2 <= float(found.group(1)) <= 0.3
    # The running totals behind it, and the step loop's parts, as counters.
    device = value_of(text, "hymt_engine_device_seconds_total")
    waited = value_of(text, 'hymt_engine_loop_seconds_total{part="wait"}')
    worked = value_of(text, 'hymt_engine_loop_seconds_total{part="host"}')
    assert device is not None
    assert waited is not None
    assert worked is not None
    assert device > 0
    assert waited > 0
    assert worked == pytest.approx(3 * waited, rel=0.2)
    demo_text = (await demo.http.get("/metrics")).text
    assert "hymt_engine_device_busy_ratio{" not in demo_text
    assert value_of(demo_text, "hymt_engine_device_seconds_total") == 0


def value_of(text: str, sample: str) -> float | None:
    """The value of ``sample`` (a metric's name with its labels) in a /metrics text."""
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def _series(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def test_a_generation_cut_at_its_token_budget_is_counted(
    start_app: StartApp, fake: FakeControl
) -> None:
    # A generation that stops at the text's budget is an answer cut short, which operators
    # must be able to see; one that ended its turn is not counted.
    text = {"text": "Cut me short", "target_lang": "it"}
    for finish, counted in (("length", 1), ("stop", 0)):
        client = await start_app(loader=fake.loader(finish_reason=finish), warmup=False)
        assert (await client.http.post("/translate", json=text)).status_code == 200
        metrics = (await client.http.get("/metrics")).text
        assert _series(metrics, "hymt_generations_cut_total") == counted, finish
        assert _series(metrics, "hymt_generated_tokens_total") > 0
