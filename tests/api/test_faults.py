"""Overload, generation failures and engine faults through HTTP, with a fake engine in a real
engine process standing in for the GPU."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

import httpx

from service.frontend.engine_link.client import EngineClient
from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl, process_alive


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    waited = time.monotonic()
    while not condition():
        if time.monotonic() - waited > timeout_s:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def send(client: ServiceClient, text: str) -> asyncio.Task[httpx.Response]:
    return asyncio.ensure_future(
        client.http.post("/translate", json={"text": text, "target_lang": "de"})
    )


def engine_pid(client: ServiceClient) -> int:
    engine = client.runtime.supervisor.client
    assert isinstance(engine, EngineClient)
    assert engine.pid is not None
    return engine.pid


async def test_full_queue_answers_429_with_retry_after(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(capacity=1), warmup=False, max_queue_size=3)
    fake.hold()
    held = [send(client, "t0")]
    await until(lambda: bool(fake.batches))
    held += [send(client, "t1"), send(client, "t2")]
    await until(lambda: client.runtime.in_flight == 3)
    refused = await client.http.post("/translate", json={"text": "late", "target_lang": "de"})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "overloaded"
    assert int(refused.headers["retry-after"]) >= 1
    # Refused before the body is read, in each dialect's own shape.
    refused_lt = await client.http.post(
        "/libretranslate/translate", json={"q": "x", "source": "en", "target": "de"}
    )
    assert refused_lt.status_code == 429
    assert "error" in refused_lt.json()
    refused_deepl = await client.http.post(
        "/v2/translate", json={"text": ["x"], "target_lang": "DE"}
    )
    assert refused_deepl.status_code == 429
    assert "message" in refused_deepl.json()
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_queue_rejections_total{reason="queue_full"} 3.0' in metrics
    assert 'route="/v2/translate",status="429"' in metrics
    fake.release()
    assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]


async def test_generation_failure_is_500_without_internals(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(error="CUDA secret at 0xdeadbeef"), warmup=False)
    response = await client.http.post("/translate", json={"text": "x", "target_lang": "de"})
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "generation_failed", "message": "the model failed to generate"}
    }
    assert "deadbeef" not in response.text


async def test_a_flood_of_8x_the_bound_gets_only_translations_or_429s(
    start_app: StartApp, fake: FakeControl
) -> None:
    bound = 16
    client = await start_app(
        loader=fake.loader(delay_s=0.05, capacity=4),
        warmup=False,
        max_queue_size=bound,
    )
    assert (await send(client, "first")).status_code == 200
    responses = await asyncio.gather(*(send(client, f"flood {i}") for i in range(8 * bound)))
    statuses = [response.status_code for response in responses]
    assert set(statuses) == {200, 429}, statuses
    assert len(responses) == 8 * bound  # none lost
    assert all(r.headers["retry-after"] for r in responses if r.status_code == 429)
    # Refused before any model work: the engine saw exactly the requests that got 200.
    assert fake.items_seen == statuses.count(200) + 1
    assert (await send(client, "after")).status_code == 200


async def test_under_twice_the_sustainable_load_admitted_requests_finish_in_time(
    start_app: StartApp, fake: FakeControl
) -> None:
    # Capacity: batches of 4 texts every 0.1 s = 40 texts/s. Offered: 80/s for 3 s.
    client = await start_app(
        loader=fake.loader(delay_s=0.1, capacity=4),
        warmup=False,
        max_queue_size=1000,
    )
    assert (await send(client, "first")).status_code == 200

    async def one(index: int) -> httpx.Response:
        response: httpx.Response = await client.http.post(
            "/translate",
            json={"text": f"load {index}", "target_lang": "de"},
            headers={"X-Request-Timeout": "1.0"},
        )
        return response

    tasks = []
    for index in range(240):
        tasks.append(asyncio.ensure_future(one(index)))
        await asyncio.sleep(1 / 80)
    statuses = [response.status_code for response in await asyncio.gather(*tasks)]
    admitted = [status for status in statuses if status != 429]
    assert set(statuses) <= {200, 429, 504}
    assert statuses.count(429) > 0  # the excess is refused up front
    assert statuses.count(200) >= 0.9 * len(admitted), statuses
    print(f"\ngoodput: {statuses.count(200)} ok, {statuses.count(504)} late, "
          f"{statuses.count(429)} refused of {len(statuses)}")  # fmt: skip


async def test_a_killed_engine_fails_fast_and_is_restarted(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(capacity=1), warmup=False)
    fake.hold()
    in_flight = [send(client, f"in flight {i}") for i in range(3)]
    await until(lambda: bool(fake.batches))
    pid = engine_pid(client)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    responses = await asyncio.wait_for(asyncio.gather(*in_flight), timeout=1.0)
    assert [r.status_code for r in responses] == [503, 503, 503]
    assert all(r.json()["error"]["code"] == "engine_unavailable" for r in responses)
    health = await client.http.get("/health")
    live = await client.http.get("/live")
    assert (health.status_code, live.status_code) == (503, 503)
    refused = await client.http.post("/translate", json={"text": "new", "target_lang": "de"})
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert time.monotonic() - killed < 1.0
    fake.release()
    await client.runtime.wait_started()
    assert (await client.http.get("/health")).status_code == 200
    assert engine_pid(client) != pid
    assert (await send(client, "after restart")).status_code == 200
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_engine_restarts_total{reason="exited"} 1.0' in metrics


async def test_a_hung_engine_is_detected_by_its_missing_heartbeat(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(), warmup=False, engine_heartbeat_timeout_s=0.5)
    pid = engine_pid(client)
    os.kill(pid, signal.SIGSTOP)  # alive, silent
    stopped = time.monotonic()
    await until(lambda: client.runtime.failure() is not None, timeout_s=2.0)
    assert time.monotonic() - stopped < 1.0
    assert (await client.http.get("/live")).status_code == 503
    await until(lambda: not process_alive(pid) or _zombie(pid), timeout_s=5.0)
    await client.runtime.wait_started()
    assert (await send(client, "after the hang")).status_code == 200
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_engine_restarts_total{reason="hung"} 1.0' in metrics


async def test_a_stalled_engine_fails_its_requests_and_is_restarted(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(capacity=1), warmup=False, stall_timeout_s=0.3)
    pid = engine_pid(client)
    fake.hold()  # the heartbeat goes on, the batch never ends
    held = send(client, "held")
    response = await asyncio.wait_for(held, timeout=3.0)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_stalled"
    fake.release()
    await client.runtime.wait_started()
    assert engine_pid(client) != pid
    assert (await send(client, "fresh")).status_code == 200


async def test_an_engine_wedged_while_requests_expire_is_found_stalled(
    start_app: StartApp, fake: FakeControl
) -> None:
    """Requests ending at their deadline are not progress: an engine that holds work and
    generates nothing is restarted within the stall window, not ready meanwhile."""
    client = await start_app(loader=fake.loader(capacity=1), warmup=False, stall_timeout_s=1.0)
    pid = engine_pid(client)
    fake.hold()
    held = send(client, "held")
    await until(lambda: bool(fake.batches))
    started = time.monotonic()
    expired: list[int] = []
    # The test process's loop is often blocked (a heap holding torch); that time does not
    # count towards the stall window, so the bound here is loose.
    while not held.done() and time.monotonic() - started < 15.0:
        short = await client.http.post(
            "/translate",
            json={"text": f"short {len(expired)}", "target_lang": "de"},
            headers={"X-Request-Timeout": "0.15"},
        )
        expired.append(short.status_code)
    assert held.done(), "the wedged engine was never found stalled"
    response = await held
    assert response.json()["error"]["code"] == "engine_stalled"
    assert 504 in expired  # requests did end meanwhile, at their deadline
    assert (await client.http.get("/health")).status_code == 503
    fake.release()
    await client.runtime.wait_started()
    assert engine_pid(client) != pid


async def test_a_blocked_event_loop_does_not_get_a_healthy_engine_killed(
    start_app: StartApp, fake: FakeControl
) -> None:
    """The engine's heartbeats wait unread while a handler blocks the loop: that time is not
    held against the engine (a 1 GiB document once got a healthy engine killed this way)."""
    client = await start_app(loader=fake.loader(), warmup=False, engine_heartbeat_timeout_s=0.5)
    pid = engine_pid(client)
    for _ in range(3):
        time.sleep(1.5)  # noqa: ASYNC251 - the blocked loop under test
        await asyncio.sleep(0.3)
    assert engine_pid(client) == pid
    assert client.runtime.failure() is None
    assert (await send(client, "still here")).status_code == 200
    metrics = (await client.http.get("/metrics")).text
    assert "hymt_engine_restarts_total{" not in metrics
    blind = [ln for ln in metrics.splitlines() if ln.startswith("hymt_engine_watchdog_blind_total")]
    # The three blocks, and any collector pause of this test process's heap besides.
    assert float(blind[0].split()[1]) >= 3


async def test_an_engine_that_cannot_load_turns_liveness_red(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(load_s=-1), warmup=False)
    assert (await client.http.get("/live")).status_code == 503
    health = await client.http.get("/health")
    assert health.status_code == 503
    assert health.json()["error"]["code"] == "engine_unavailable"


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


async def test_a_killed_preparation_worker_is_replaced_and_nothing_else_fails(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(), warmup=False, prepare_workers=2)
    preparer = client.runtime.preparer
    assert preparer is not None
    before = list(preparer.pids)
    victim = before[0]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    await until(lambda: None not in preparer.pids and preparer.pids[0] != victim)
    # The replacement takes work again; the other worker never stopped.
    responses = await asyncio.gather(*(send(client, f"after {i}") for i in range(8)))
    assert [r.status_code for r in responses] == [200] * 8
    assert preparer.pids[1] == before[1]


async def test_a_hung_preparation_worker_is_killed_and_its_callers_answered(
    start_app: StartApp, fake: FakeControl
) -> None:
    # A worker that stops answering (stopped here; a text that wedges its detector or tokenizer
    # in the wild) kept its callers waiting for ever, their admission held, /health ready.
    client = await start_app(
        loader=fake.loader(), warmup=False, prepare_workers=1, prepare_timeout_s=0.5
    )
    preparer = client.runtime.preparer
    assert preparer is not None
    victim = preparer.pids[0]
    assert victim is not None
    os.kill(victim, signal.SIGSTOP)
    try:
        stuck = await asyncio.wait_for(send(client, "stuck"), 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert stuck.status_code == 503
    assert stuck.json()["error"]["code"] == "engine_unavailable"
    await until(lambda: preparer.pids[0] not in (None, victim))
    for _ in range(100):  # the replacement takes work once it has the tokenizer
        after = await send(client, "after")
        if after.status_code == 200:
            break
        await asyncio.sleep(0.1)
    assert after.status_code == 200
    metrics = (await client.http.get("/metrics")).text
    assert "hymt_in_flight_texts 0.0" in metrics
