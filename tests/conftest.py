"""Shared fixtures: the demo model built once per session, settings, and app clients."""

from __future__ import annotations

import os
import sys

# Triton reads its interpreter switch when it is first imported: the GPU kernels' tests
# (tests/engine/test_gemv.py, test_decode_kernel.py, test_fast.py) run them through the
# interpreter on the CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Every engine the tests start, in this process or in a service process they spawn (which
# inherits the environment), gets an explicit KV-cache budget: 128 pages of 16 tokens.
os.environ.setdefault("HYMT_FAST_NUM_PAGES", "128")
os.environ.setdefault("HYMT_FAST_PAGE_SIZE", "16")

import asyncio
import concurrent.futures.thread
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from loadtests.stack import free_port
from service.config.engine import EngineLoader
from service.config.settings import Settings
from service.engine.demo import ensure_demo_model
from service.frontend.runtime import Runtime
from service.wiring import create_service
from tests.fakes import FakeControl

MakeSettings = Callable[..., Settings]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    ensure_demo_model(folder)
    return folder


@pytest.fixture
def make_settings(data_dir: Path) -> MakeSettings:
    """Settings for tests: the session's demo model, greedy decoding, no .env file (the KV
    cache's budget comes from the environment set above)."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"data_dir": data_dir, "greedy": True}
        values.update(overrides)
        return Settings(_env_file=None, **values)

    return make


class ServiceClient:
    """An httpx client bound to a started app, with its runtime at hand."""

    def __init__(self, app: FastAPI, http: httpx.AsyncClient) -> None:
        self.app = app
        self.http = http

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime


StartApp = Callable[..., Any]


@pytest.fixture
async def start_app(make_settings: MakeSettings) -> AsyncIterator[StartApp]:
    """Start an app (demo model unless a loader is given) and wait until its load ended."""
    stack: list[tuple[LifespanManager, httpx.AsyncClient]] = []

    async def start(
        *, loader: EngineLoader | None = None, wait: bool = True, **overrides: Any
    ) -> ServiceClient:
        settings = make_settings(**overrides)
        app = create_service(settings, loader)
        manager = LifespanManager(app, startup_timeout=120, shutdown_timeout=60)
        await manager.__aenter__()
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://service"
        )
        stack.append((manager, http))
        client = ServiceClient(app, http)
        if wait:
            await client.runtime.wait_started()
        return client

    yield start
    for manager, http in reversed(stack):
        await http.aclose()
        await manager.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def started(
    settings: Settings, loader: EngineLoader | None = None, **options: Any
) -> AsyncIterator[ServiceClient]:
    """An app started on ``settings`` (demo model unless ``loader``), for wider-scoped fixtures;
    ``options`` go to ``create_service``."""
    if loader is not None:
        options["loader"] = loader
    app = create_service(settings, **options)
    async with LifespanManager(app, startup_timeout=120, shutdown_timeout=60) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as http:
            client = ServiceClient(app, http)
            await asyncio.wait_for(client.runtime.wait_started(), 120)
            yield client


@contextlib.contextmanager
def served(settings: Settings, loader: EngineLoader) -> Iterator[httpx.Client]:
    """An app on ``settings`` served by uvicorn on loopback from a thread of its own, ready, and
    a synchronous client to it: for tests that drive it from synchronous code (hypothesis, the
    official clients)."""
    port = free_port()
    app = create_service(settings, loader)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, name="served-app", daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the service did not become ready"
            time.sleep(0.1)
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(60)


def own_data(data_dir: Path, folder: Path) -> Path:
    """A data directory of a test's own (empty job and glossary stores) sharing the demo
    models."""
    folder.mkdir(parents=True, exist_ok=True)
    for built in data_dir.iterdir():
        # The shared stores stay behind, SQLite's -wal and -shm files with their database.
        if built.name != "documents" and not built.name.startswith("glossaries.sqlite3"):
            (folder / built.name).symlink_to(built)
    return folder


@pytest.fixture(scope="session")
async def demo(data_dir: Path) -> AsyncIterator[ServiceClient]:
    """One started service on the demo model, shared by the tests that only read from it (its
    cache and counters are shared too: such tests use texts of their own)."""
    settings = Settings(_env_file=None, data_dir=data_dir, greedy=True)
    async with started(settings) as client:
        yield client


# The keys of ``keyed``.
KEYS = ("k", "k2")


@pytest.fixture(scope="session")
async def keyed(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ServiceClient]:
    """One fake-engine service that requires the keys ``KEYS``, shared by the dialect tests that
    only read from it (usage counts are per key: such tests measure differences)."""
    fake = FakeControl(tmp_path_factory.mktemp("keyed-fake"))
    settings = Settings(_env_file=None, data_dir=data_dir, warmup=False, api_keys=list(KEYS))
    async with started(settings, fake.loader()) as client:
        yield client


@pytest.fixture
def fake(tmp_path: Path) -> FakeControl:
    """A fake engine's controls (gate, record of batches) in this test's folder."""
    return FakeControl(tmp_path / "fake")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Fail, rather than hang, when a test left a thread that is not a daemon running: the
    interpreter waits for every such thread at exit, so the run would never end (transformers'
    continuous-batching thread of an engine not closed did this in CI)."""
    left = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread()
        and not thread.daemon
        and thread.is_alive()
        # An executor's idle worker: its module's exit hook stops and joins it.
        and getattr(thread, "_target", None) is not concurrent.futures.thread._worker
    ]
    for thread in left:
        thread.join(timeout=5)
    stuck = [thread.name for thread in left if thread.is_alive()]
    if stuck:
        sys.stdout.flush()
        sys.stderr.write(f"\ntests left threads running that keep the process alive: {stuck}\n")
        sys.stderr.flush()
        os._exit(3)
