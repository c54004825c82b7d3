"""Deadlines, disconnects, out-of-memory splitting and per-item batch results."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.api.test_faults import send, until
from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl


async def hold_worker(client: ServiceClient, fake: FakeControl) -> asyncio.Task[httpx.Response]:
    """Start one request that the gated engine keeps running."""
    fake.hold()
    held = send(client, "hold")
    await until(lambda: bool(fake.batches))
    return held


async def test_an_expired_request_is_504_and_never_reaches_the_model(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(capacity=1), warmup=False)
    held = await hold_worker(client, fake)
    began = time.monotonic()
    late = await client.http.post(
        "/translate",
        json={"text": "too late", "target_lang": "de"},
        headers={"X-Request-Timeout": "0.2"},
    )
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "deadline_exceeded"
    assert 0.15 <= time.monotonic() - began < 2
    fake.release()
    await held
    await asyncio.sleep(0.1)
    assert fake.items_seen == 1  # only the held request
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_queue_rejections_total{reason="deadline"} 1.0' in metrics


async def test_the_client_deadline_can_only_lower_the_servers(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(delay_s=0.3), warmup=False, request_timeout_s=0.15)
    response = await client.http.post(
        "/translate",
        json={"text": "slow", "target_lang": "de"},
        headers={"X-Request-Timeout": "30"},
    )
    assert response.status_code == 504
    for bad in ("-1", "0.01", "abc", "nan"):
        refused = await client.http.post(
            "/translate",
            json={"text": "x", "target_lang": "de"},
            headers={"X-Request-Timeout": bad},
        )
        assert refused.status_code == 422, bad
        assert "X-Request-Timeout" in refused.json()["error"]["message"]


async def test_a_caller_that_leaves_is_dropped_before_the_model(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(capacity=1), warmup=False)
    held = await hold_worker(client, fake)
    leaving = send(client, "bye")
    await until(lambda: client.runtime.in_flight == 2)
    leaving.cancel()
    await until(lambda: client.runtime.in_flight == 1)
    fake.release()
    await held
    await asyncio.sleep(0.1)
    assert fake.items_seen == 1
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_queue_rejections_total{reason="cancelled"} 1.0' in metrics


async def test_out_of_memory_fails_what_the_step_held_and_the_engine_serves_on(
    start_app: StartApp, fake: FakeControl
) -> None:
    texts = ["a text that fits", "the one text too big for the gpu"]
    probe = await start_app(loader=fake.loader(), warmup=False)
    prompts = probe.runtime.translator._prompts
    target, source = prompts.languages_of("de", "en")
    poison = len(prompts.prepare(texts[-1], target, source, field="t").request.prompt_ids)
    client = await start_app(loader=fake.loader(oom_prompt_length=poison), warmup=False)
    single = await client.http.post(
        "/translate", json={"text": texts[-1], "target_lang": "de", "source_lang": "en"}
    )
    assert single.status_code == 507
    assert single.json()["error"]["code"] == "out_of_memory"
    # The engine is still there: the next request is answered.
    fine = await client.http.post(
        "/translate", json={"text": texts[0], "target_lang": "de", "source_lang": "en"}
    )
    assert fine.status_code == 200, fine.text


async def test_a_batch_that_fails_whole_answers_with_the_error(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(oom_above=0), warmup=False)
    response = await client.http.post(
        "/batch_translate", json={"texts": ["a", "b"], "target_lang": "de"}
    )
    assert response.status_code == 507
    assert response.json()["error"]["code"] == "out_of_memory"
