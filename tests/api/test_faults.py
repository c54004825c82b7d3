"""Overload and generation failures through HTTP, with a fake engine standing in for the GPU."""

from __future__ import annotations

import asyncio
import threading

from tests.conftest import StartApp, fake_loader
from tests.fakes import FakeEngine


async def test_full_queue_answers_429_with_retry_after(start_app: StartApp) -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)
    client = await start_app(
        loader=fake_loader(engine), warmup=False, max_batch_size=1, max_queue_size=2, max_wait_ms=0
    )
    held = [
        asyncio.ensure_future(
            client.http.post("/translate", json={"text": f"t{i}", "target_lang": "de"})
        )
        for i in range(3)
    ]
    # One running (held by the gate), two queued.
    for _ in range(500):
        if client.runtime.queue_depth == 2 and engine.batches:
            break
        await asyncio.sleep(0.01)
    refused = await client.http.post("/translate", json={"text": "late", "target_lang": "de"})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "overloaded"
    assert int(refused.headers["retry-after"]) >= 1
    gate.set()
    assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]


async def test_generation_failure_is_500_without_internals(start_app: StartApp) -> None:
    engine = FakeEngine(fail=lambda batch: RuntimeError("CUDA kernel secret at 0xdeadbeef"))
    client = await start_app(loader=fake_loader(engine), warmup=False)
    response = await client.http.post("/translate", json={"text": "x", "target_lang": "de"})
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "generation_failed", "message": "the model failed to generate"}
    }
    assert "deadbeef" not in response.text
