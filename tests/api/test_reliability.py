"""Deadlines, disconnects, out-of-memory splitting, stalls and per-item batch results."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import httpx
import torch

from service.engine.types import GenerationRequest
from tests.conftest import ServiceClient, StartApp, fake_loader
from tests.fakes import FakeEngine


async def wait_for_batches(engine: FakeEngine, count: int) -> None:
    for _ in range(500):
        if len(engine.batches) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine got {len(engine.batches)} batches, not {count}")


async def hold_worker(client: ServiceClient, engine: FakeEngine) -> asyncio.Task[httpx.Response]:
    """Start one request that the gated engine keeps running."""
    held = asyncio.ensure_future(
        client.http.post("/translate", json={"text": "hold", "target_lang": "de"})
    )
    await wait_for_batches(engine, 1)
    return held


async def test_an_expired_request_is_504_and_never_reaches_the_model(start_app: StartApp) -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    client = await start_app(loader=fake_loader(engine), warmup=False, max_batch_size=1)
    held = await hold_worker(client, engine)
    began = time.monotonic()
    late = await client.http.post(
        "/translate",
        json={"text": "too late", "target_lang": "de"},
        headers={"X-Request-Timeout": "0.2"},
    )
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "deadline_exceeded"
    assert 0.15 <= time.monotonic() - began < 2
    gate.set()
    await held
    await asyncio.sleep(0.05)
    assert engine.items_seen == 1  # only the held request
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_queue_rejections_total{reason="deadline"} 1.0' in metrics


async def test_the_client_deadline_can_only_lower_the_servers(start_app: StartApp) -> None:
    engine = FakeEngine(delay_s=0.3)
    client = await start_app(loader=fake_loader(engine), warmup=False, request_timeout_s=0.1)
    response = await client.http.post(
        "/translate",
        json={"text": "slow", "target_lang": "de"},
        headers={"X-Request-Timeout": "30"},
    )
    assert response.status_code == 504
    bad = await client.http.post(
        "/translate", json={"text": "x", "target_lang": "de"}, headers={"X-Request-Timeout": "-1"}
    )
    assert bad.status_code == 422


async def test_a_caller_that_leaves_is_dropped_before_the_model(start_app: StartApp) -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    client = await start_app(loader=fake_loader(engine), warmup=False, max_batch_size=1)
    held = await hold_worker(client, engine)
    leaving = asyncio.ensure_future(
        client.http.post("/translate", json={"text": "bye", "target_lang": "de"})
    )
    for _ in range(100):
        if client.runtime.queue_depth == 1:
            break
        await asyncio.sleep(0.01)
    leaving.cancel()
    await asyncio.sleep(0.05)
    gate.set()
    await held
    await asyncio.sleep(0.05)
    assert engine.items_seen == 1
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_queue_rejections_total{reason="cancelled"} 1.0' in metrics


def oom_above(limit: int, poison: int) -> object:
    def fail(batch: Sequence[GenerationRequest]) -> Exception | None:
        if len(batch) > limit or any(len(r.prompt_ids) == poison for r in batch):
            return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return None

    return fail


async def test_out_of_memory_splits_the_batch_and_fails_only_the_culprit(
    start_app: StartApp,
) -> None:
    # CharEncoder: prompt length = len(rendered prompt) + 2; find the poison text's length.
    texts = [f"text number {i}" for i in range(7)] + ["the one text too big for the gpu"]
    engine = FakeEngine()
    client = await start_app(loader=fake_loader(engine), warmup=False, max_batch_size=8)
    prompts = client.runtime.translator._prompts
    target, source = prompts.languages_of("de", None)
    poison = len(prompts.prepare(texts[-1], target, source, field="t").request.prompt_ids)
    engine.fail = oom_above(2, poison)  # type: ignore[assignment]
    response = await client.http.post(
        "/batch_translate", json={"texts": texts, "target_lang": "de"}
    )
    assert response.status_code == 200, response.text
    items = response.json()["translations"]
    assert all("translation" in item for item in items[:-1])
    assert items[-1] == {
        "error": {"code": "out_of_memory", "message": "out of memory generating a batch of 1"}
    }
    sizes = [len(batch) for batch in engine.batches]
    assert sizes[0] == 8
    assert max(sizes[1:]) <= 4
    single = await client.http.post("/translate", json={"text": texts[-1], "target_lang": "de"})
    assert single.status_code == 507


async def test_a_batch_that_fails_whole_answers_with_the_error(start_app: StartApp) -> None:
    engine = FakeEngine(fail=lambda batch: torch.OutOfMemoryError("oom"))
    client = await start_app(loader=fake_loader(engine), warmup=False)
    response = await client.http.post(
        "/batch_translate", json={"texts": ["a", "b"], "target_lang": "de"}
    )
    assert response.status_code == 507
    assert response.json()["error"]["code"] == "out_of_memory"


async def test_a_stalled_worker_turns_health_red_and_fails_fast(start_app: StartApp) -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    client = await start_app(
        loader=fake_loader(engine), warmup=False, max_batch_size=1, stall_timeout_s=0.3
    )
    held = await hold_worker(client, engine)
    queued = asyncio.ensure_future(
        client.http.post("/translate", json={"text": "queued", "target_lang": "de"})
    )
    await asyncio.sleep(0.6)
    health = await client.http.get("/health")
    assert health.status_code == 503
    assert health.json()["error"]["code"] == "engine_stalled"
    assert (await client.http.get("/live")).status_code == 503
    queued_response = await asyncio.wait_for(queued, timeout=1)
    assert queued_response.status_code == 503
    began = time.monotonic()
    fresh = await client.http.post("/translate", json={"text": "new", "target_lang": "de"})
    assert fresh.status_code == 503
    assert time.monotonic() - began < 1  # refused at once, not after the stalled batch
    gate.set()
    await held
    assert (await client.http.get("/health")).status_code == 200  # recovered
