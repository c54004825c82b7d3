"""The API process's event loop: nothing on a request's path waits for a thread, no torch."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import fastapi.dependencies.utils
import fastapi.routing
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import Histogram
from starlette.concurrency import run_in_threadpool

from service.frontend.api.middleware import Door
from service.frontend.app import AdmissionGate
from service.frontend.metrics import Metrics
from service.frontend.translation import markup, markup_texts
from tests.api.test_faults import until
from tests.api.test_protocol import Gate
from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl

_NATIVE = {"text": "hello", "target_lang": "de"}
# A request to every kind of route, each answered 200.
_EVERY_ROUTE: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/health", {}),
    ("GET", "/live", {}),
    ("GET", "/metrics", {}),
    ("GET", "/languages", {}),
    ("POST", "/translate", {"json": _NATIVE}),
    ("GET", "/translate", {"params": {"text": "hello", "target_lang": "de"}}),
    ("POST", "/batch_translate", {"json": {"texts": ["a", "b"], "target_lang": "de"}}),
    ("POST", "/detect", {"json": {"texts": ["hello"]}}),
    ("GET", "/libretranslate/languages", {}),
    (
        "POST",
        "/libretranslate/translate",
        {"json": {"q": "hi", "source": "en", "target": "de"}},
    ),
    ("POST", "/libretranslate/detect", {"json": {"q": "hello"}}),
    ("GET", "/v2/languages", {}),
    ("POST", "/v2/translate", {"json": {"text": ["hi"], "target_lang": "DE"}}),
    ("GET", "/v2/usage", {}),
    ("POST", "/language/translate/v2", {"json": {"q": ["hi"], "target": "de"}}),
    ("POST", "/language/translate/v2/detect", {"json": {"q": ["hello"]}}),
    ("GET", "/language/translate/v2/languages", {"params": {"target": "de"}}),
    (
        "POST",
        "/v3/projects/p/locations/global:translateText",
        {"json": {"contents": ["hi"], "targetLanguageCode": "de"}},
    ),
    ("POST", "/v3/projects/p:detectLanguage", {"json": {"content": "hello"}}),
    ("GET", "/v3/projects/p/supportedLanguages", {}),
]


async def _call_every_route(client: ServiceClient) -> None:
    for method, path, kwargs in _EVERY_ROUTE:
        response = await client.http.request(method, path, **kwargs)
        assert response.status_code == 200, (path, response.text)


async def test_no_route_waits_for_the_thread_pool(
    start_app: StartApp, fake: FakeControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FastAPI runs a plain ``def`` dependency or route in its pool of 40 threads: a sync
    # dependency on /health made the probe queue behind a flood of translation requests.
    hops: list[str] = []

    async def recorded(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__qualname__", repr(func)))
        return await run_in_threadpool(func, *args, **kwargs)

    for module in (fastapi.routing, fastapi.dependencies.utils):
        monkeypatch.setattr(module, "run_in_threadpool", recorded)
    client = await start_app(loader=fake.loader(), warmup=False)
    await _call_every_route(client)
    assert hops == []


def test_the_api_process_never_imports_torch(data_dir: Path) -> None:
    # The engine process owns torch; an import here would cost the API process seconds and
    # gigabytes at start and put the GIL-holding model code back beside the event loop.
    script = (
        "import sys\n"
        "from service.wiring import create_service\n"
        "from service.config.settings import Settings\n"
        f"create_service(Settings(_env_file=None, data_dir={str(data_dir)!r}))\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


async def test_a_burst_is_turned_away_at_the_door_once_its_first_requests_fill_the_queue(
    start_app: StartApp, fake: FakeControl
) -> None:
    # A request reaches admission before the loop serves the next one. Otherwise every request
    # of a burst passes the door's "full?" check before the first is admitted, and the rest go
    # the long way (body, validation, routing) to a refusal: here a malformed body would then
    # be answered 422 instead of the door's 429.
    bound = 4
    client = await start_app(loader=fake.loader(), warmup=False, max_queue_size=bound)
    fake.hold()
    valid = [
        client.http.post("/translate", json={"text": f"held {i}", "target_lang": "de"})
        for i in range(bound)
    ]
    malformed = [
        client.http.post(
            "/translate", content=b"{not json", headers={"content-type": "application/json"}
        )
        for _ in range(20)
    ]
    tasks = [asyncio.ensure_future(request) for request in valid + malformed]
    await until(lambda: client.runtime.in_flight == bound)
    await until(lambda: all(task.done() for task in tasks[bound:]))
    statuses = [task.result().status_code for task in tasks[bound:]]
    assert statuses == [429] * 20
    fake.release()
    assert [(await task).status_code for task in tasks[:bound]] == [200] * bound


async def test_the_last_refusals_are_logged_at_shutdown_not_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A summary still pending when the app stops is logged then, and its timer does not fire
    # later, into whatever runs on the loop next.
    door = Door(Metrics(), Gate())
    scope: Any = {"type": "http", "method": "POST", "path": "/translate", "headers": []}
    with caplog.at_level(logging.INFO, logger="service.frontend.access"):
        door.record(scope, 0.001)
        door.record(scope, 0.002)
        door.close()
        lines = [r for r in caplog.records if r.getMessage() == "refused at the door"]
        assert [line.count for line in lines] == [2]  # type: ignore[attr-defined]
        await asyncio.sleep(1.2)  # past the summary period
    assert len([r for r in caplog.records if r.getMessage() == "refused at the door"]) == 1


async def test_a_refusal_leaves_its_metrics_for_later_and_every_rendering_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A flood's refusals are over in milliseconds; their metrics (a few microseconds each, more
    # in the shared files of several processes) were counted between them.
    metrics = Metrics()
    door = Door(metrics, Gate())
    touched: list[str] = []
    for kind in (type(metrics.requests.labels("/", "POST", "429")), Histogram):
        for name in ("inc", "observe"):
            if hasattr(kind, name):
                original = getattr(kind, name)

                def spy(self: Any, *args: Any, _name: str = name, _original: Any = original) -> Any:
                    touched.append(_name)
                    return _original(self, *args)

                monkeypatch.setattr(kind, name, spy)
    scope: Any = {"type": "http", "method": "POST", "path": "/translate", "headers": []}
    for _ in range(3):
        door.record(scope, 0.001)
    assert touched == []
    text = metrics.render().decode()
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 3.0' in text
    door.record(scope, 0.001)
    door.flush()  # the period's end: counted without a rendering
    monkeypatch.undo()
    text = metrics.render().decode()
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 4.0' in text
    assert 'hymt_request_duration_seconds_count{method="POST",route="/translate"} 4.0' in text
    door.close()


async def test_refusals_at_the_door_are_logged_as_one_line_with_their_count(
    start_app: StartApp, fake: FakeControl, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start_app(loader=fake.loader(), warmup=False, max_queue_size=1)
    fake.hold()
    held = asyncio.ensure_future(
        client.http.post("/translate", json={"text": "held", "target_lang": "de"})
    )
    await until(lambda: client.runtime.in_flight == 1)

    def summaries() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "refused at the door"]

    with caplog.at_level(logging.INFO, logger="service.frontend.access"):
        started = time.monotonic()
        refused = [
            await client.http.post("/translate", json={"text": f"x{i}", "target_lang": "de"})
            for i in range(30)
        ]
        elapsed = time.monotonic() - started
        assert [r.status_code for r in refused] == [429] * 30
        await until(lambda: sum(s.count for s in summaries()) == 30)  # type: ignore[attr-defined]
    # One line per second of refusals (one, where the 30 take under a second; a loaded machine
    # can take longer), each with its count and routes.
    lines = summaries()
    assert len(lines) <= int(elapsed) + 1
    assert all(set(s.routes) == {"/translate"} for s in lines)  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.getMessage() == "request"]
    # Counted one by one in the metrics all the same.
    metrics = (await client.http.get("/metrics")).text
    assert 'hymt_requests_total{method="POST",route="/translate",status="429"} 30.0' in metrics
    fake.release()
    assert (await held).status_code == 200


async def test_no_request_builds_the_routing_state_it_was_built_at_start(
    start_app: StartApp, fake: FakeControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FastAPI builds a router's matching state at the first request matched against it, on the
    # event loop: the first request of each process and dialect stopped the loop for tens of
    # milliseconds. The hook is FastAPI's own (private) builder of a route's state.
    client = await start_app(loader=fake.loader(), warmup=False)
    built: list[str] = []
    builder = fastapi.routing._EffectiveRouteContext.from_api_route

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(str(kwargs.get("original_route", args[0] if args else "?")))
        return builder(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing._EffectiveRouteContext, "from_api_route", counted)
    await _call_every_route(client)
    assert built == []


async def test_markup_is_read_at_its_tags_outside_the_api_process(
    start_app: StartApp, fake: FakeControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linear, reading markup still costs about a second of CPU a megabyte (a DeepL body of
    # HTML): in the API process that second held every request it serves, /health included.
    # The preparation workers read it; in the API process it would fail here.
    def not_here(*args: object, **kwargs: object) -> object:
        raise AssertionError("markup read on the API process's event loop")

    monkeypatch.setattr(markup, "segment", not_here)
    monkeypatch.setattr(markup_texts, "segment", not_here, raising=False)
    client = await start_app(loader=fake.loader(answer="Hallo <b>Welt</b>"), warmup=False)
    response = await client.http.post(
        "/v2/translate",
        json={"text": ["<p>Hello <b>world</b></p>"], "target_lang": "DE", "tag_handling": "html"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["text"] == "<p>Hallo <b>Welt</b></p>"


_SEGMENT = st.text(st.characters(exclude_characters="/:?#%", codec="ascii"), min_size=1)


@given(
    parents=st.lists(
        st.tuples(_SEGMENT, st.none() | _SEGMENT),
        min_size=1,
        max_size=20,
    )
)
def test_door_refusals_count_under_route_templates_never_the_paths_clients_choose(
    parents: list[tuple[str, str | None]],
) -> None:
    # Google v3's parent is the client's to choose: each refusal of a flood to a new project
    # made a new series in the metrics, kept (and scraped) for good.
    gate = AdmissionGate(cast(Any, None))
    routes = set()
    for project, location in parents:
        located = "" if location is None else f"/locations/{location}"
        routes.add(gate.route({"path": f"/v3/projects/{project}{located}:translateText"}))
    routes.add(gate.route({"path": "/v3/projects/a/b/c:translateText"}))
    routes.add(gate.route({"path": "/translate"}))
    assert routes <= {
        "/v3/projects/{project}:translateText",
        "/v3/projects/{project}/locations/{location}:translateText",
        "unmatched",
        "/translate",
    }
