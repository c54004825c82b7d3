"""The application factory: ``create_app(settings)`` wires the layers together.

No work happens at import time. The lifespan starts the runtime (the engine process loads in the
background so liveness answers at once) and drains and stops it on shutdown. This is the edge:
``Settings`` is split here into the per-layer configs, and no layer below sees it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import Scope

from service import __version__
from service.config.engine import EngineEntry
from service.config.settings import Settings
from service.contract.errors import Overloaded
from service.contract.protocol import Peer
from service.frontend import layers
from service.frontend.access import AccessControl
from service.frontend.api import native, probes
from service.frontend.api.deepl import DEEPL, DEEPL_V3, create_deepl_app, create_deepl_v3_app
from service.frontend.api.docs import install_docs
from service.frontend.api.errors import NATIVE, Dialect, install_error_handlers
from service.frontend.api.google import (
    GOOGLE,
    GOOGLE_V3,
    create_google_v2_app,
    create_google_v3_app,
)
from service.frontend.api.libretranslate import LIBRETRANSLATE, create_libretranslate_app
from service.frontend.api.middleware import NO_TELEMETRY, Door, RequestContextMiddleware
from service.frontend.api.openai import OPENAI, create_openai_app
from service.frontend.api.routing_state import build_routing_state
from service.frontend.api.web import install_web_page
from service.frontend.documents.jobs import JobStore
from service.frontend.documents.service import Documents
from service.frontend.glossaries import GlossaryStore
from service.frontend.local_limits import SharedFileStorage
from service.frontend.metrics import Metrics
from service.frontend.runtime import Runtime
from service.frontend.shared import Redis


def create_app(
    settings: Settings,
    *,
    entry: EngineEntry,
    metrics: Metrics | None = None,
    on_fatal: Callable[[], None] = lambda: None,
    tune_gc: bool = False,
    followers: Sequence[Peer] = (),
    follow: Peer | None = None,
    before_engine_stop: Callable[[], Awaitable[None]] | None = None,
    on_serving: Callable[[], None] | None = None,
    before_listening: Callable[[], Awaitable[None]] | None = None,
    limits_file: Path | None = None,
) -> FastAPI:
    """A new app with its own runtime and metrics registry; nothing is loaded until it starts.

    ``entry`` is what the engine process runs (``service.wiring.engine_entry``). ``on_fatal``
    is called when the engine cannot be (re)started. ``tune_gc``: tune the garbage collector
    once ready (``service.collector``), for a process that is the service. ``followers`` /
    ``follow``: this app leads (starts the engine for) or follows other API processes sharing
    one engine (``policy.following``);
    ``before_engine_stop`` is awaited on shutdown between the drain and the engine's stop;
    ``on_serving`` is called once the app first serves; a follower awaits ``before_listening``
    (after it serves itself) before uvicorn listens. ``limits_file``: the rate and quota
    counters shared by a group of API processes (``local_limits``).
    """
    metrics = metrics or Metrics()
    redis = Redis(layers.redis_config(settings), metrics) if settings.cache.redis_url else None
    runtime = Runtime(
        settings.engine_config(),
        layers.policy_config(settings),
        layers.translation_config(settings),
        metrics,
        entry,
        workers=settings.server.preparation_workers,
        on_fatal=on_fatal,
        tune_gc=tune_gc,
        followers=followers,
        follow=follow,
        before_engine_stop=before_engine_stop,
        redis=redis,
    )
    parts = _Parts(
        runtime=runtime,
        access=AccessControl(
            layers.access_config(settings),
            redis,
            SharedFileStorage(limits_file) if limits_file is not None else None,
        ),
        glossaries=GlossaryStore(
            settings.model.data_dir / "glossaries.sqlite3", layers.glossary_limits(settings)
        ),
        documents=Documents(
            JobStore(
                settings.model.data_dir / "documents", layers.documents_config(settings).limits
            ),
            lambda: runtime.translator,
            layers.documents_config(settings),
        ),
        door=Door(runtime.metrics, AdmissionGate(runtime)),
    )
    app = FastAPI(
        title="Hunyuan-MT translation service",
        version=__version__,
        summary="Continuously batched, cached translation with Tencent's Hunyuan-MT models.",
        root_path=settings.server.root_path,
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan(parts, settings, follow, on_serving, before_listening),
        telemetry=NO_TELEMETRY,
    )
    app.state.runtime, app.state.access = runtime, parts.access
    app.state.glossaries = parts.glossaries
    app.state.door = parts.door  # the HTTP server's protocol refuses through it too
    _install_routes(app, settings, parts)
    _install_middleware(app, settings, parts)
    return app


@dataclass(frozen=True, slots=True)
class _Parts:
    """What the app's routes share: the runtime, keys, glossaries, documents, the door."""

    runtime: Runtime
    access: AccessControl
    glossaries: GlossaryStore
    documents: Documents
    door: Door


def _lifespan(
    parts: _Parts,
    settings: Settings,
    follow: Peer | None,
    on_serving: Callable[[], None] | None,
    before_listening: Callable[[], Awaitable[None]] | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the runtime (the engine loads in the background) and drain and stop it at the
    end; a follower listens only once it serves."""
    runtime = parts.runtime

    async def announce() -> None:
        await runtime.wait_started()
        if on_serving is not None and runtime.failure() is None:
            on_serving()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before uvicorn listens: the first requests served do not pay for it.
        await build_routing_state(app)
        if follow is None:  # the first process of the service: no job runs anywhere yet
            await parts.documents.recover()
        parts.documents.start()
        runtime.start()
        announcing = asyncio.create_task(announce(), name="announce-serving")
        if follow is not None:
            # A follower starts listening only once it serves (uvicorn listens after start-up)
            # and the leader does: until then the kernel hands its share of the connections to
            # the processes that listen, rather than to one that could only answer 503. Or
            # until it is stopped: a leader whose engine could not be started never serves,
            # and uvicorn stops only once start-up has ended.
            await runtime.unless_stopping(_serving(announcing, before_listening))
        try:
            yield
        finally:
            announcing.cancel()
            parts.door.close()
            await parts.documents.close()
            await runtime.stop(settings.reliability.drain_timeout_s)
            parts.glossaries.close()
            await asyncio.to_thread(parts.access.close)

    return lifespan


async def _serving(
    announcing: asyncio.Task[None], before_listening: Callable[[], Awaitable[None]] | None
) -> None:
    """Until this process serves (``announcing``) and ``before_listening`` has returned."""
    await announcing
    if before_listening is not None:
        await before_listening()


def _install_routes(app: FastAPI, settings: Settings, parts: _Parts) -> None:
    app.include_router(native.router)
    app.include_router(probes.router)
    install_docs(app)
    # Compatibility dialects: thin routers over the same runtime, each with its own error shape.
    runtime, access = parts.runtime, parts.access
    app.mount("/libretranslate", create_libretranslate_app(runtime, access, parts.documents))
    app.mount("/v2", create_deepl_app(runtime, access, parts.glossaries, parts.documents))
    app.mount("/language/translate", create_google_v2_app(runtime, access))
    # Google's v3 before DeepL's: both APIs live under /v3.
    app.mount("/v3/projects", create_google_v3_app(runtime, access, parts.glossaries))
    app.mount("/v3", create_deepl_v3_app(runtime, access, parts.glossaries))
    app.mount("/v1", create_openai_app(runtime, access))
    if settings.server.web_page:
        install_web_page(app)
    install_error_handlers(app)


def _install_middleware(app: FastAPI, settings: Settings, parts: _Parts) -> None:
    if settings.server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.server.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Cache"],
        )
    app.add_middleware(
        RequestContextMiddleware,
        metrics=parts.runtime.metrics,
        max_body_bytes=settings.limits.max_body_bytes,
        door=parts.door,
        uploads=UPLOADS,
        max_upload_bytes=settings.documents.max_file_bytes,
        dialects=(LIBRETRANSLATE, DEEPL, DEEPL_V3, OPENAI, GOOGLE, GOOGLE_V3),
    )


# The routes that take a document upload (their body limit is the file limit).
UPLOADS = frozenset({"/v2/document", "/libretranslate/translate_file"})
# The routes that admit texts, and the dialect each answers in.
_ADMITTING = {
    "/translate": NATIVE,
    "/batch_translate": NATIVE,
    "/libretranslate/translate": LIBRETRANSLATE,
    "/v2/translate": DEEPL,
    "/v1/chat/completions": OPENAI,
    "/language/translate/v2": GOOGLE,
}


class AdmissionGate:
    """The door of the admitting routes: 429 in the route's dialect while admission is full,
    before the body is even read; requests on their way to admission counted as such.

    The last response is kept and sent again while admission's refusal and the dialect are the
    same ones (admission keeps its refusal while it would say the same), as all through a
    flood: building a JSON response was most of what was left of a refusal's cost once it no
    longer went through ASGI.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._last: tuple[Overloaded, Dialect, Response] | None = None

    def closed(self) -> bool:
        return self._runtime.admission.full

    def refusal(self, scope: Scope) -> Response | None:
        admission = self._runtime.admission
        if not admission.full:
            return None
        dialect = _admitting(scope)
        if dialect is None:
            return None
        error = admission.refusal()
        last = self._last
        if last is None or last[0] is not error or last[1] is not dialect:
            self._last = last = (error, dialect, dialect.response(error))
        return last[2]

    def arrive(self, scope: Scope) -> Callable[[], None] | None:
        if _admitting(scope) is None:
            return None
        return self._runtime.admission.arrive()

    def route(self, scope: Scope) -> str:
        path = _path(scope)
        if path in _ADMITTING:
            return path
        project = _GOOGLE_V3_PARENT.fullmatch(path)
        if project is None:
            return "unmatched"
        located = "/locations/{location}" if project.group(1) else ""
        return f"/v3/projects/{{project}}{located}:translateText"


# Google v3's translation routes, ``{project}`` with or without ``/locations/{location}``.
_GOOGLE_V3_PARENT = re.compile(r"/v3/projects/[^/]+(/locations/[^/]+)?:translateText")


def _path(scope: Scope) -> str:
    return str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))


def _admitting(scope: Scope) -> Dialect | None:
    """The dialect of a request that admits texts, or None for any other request."""
    if scope.get("method") != "POST":
        return None
    path = _path(scope)
    if path.startswith("/v3/projects/") and path.endswith(":translateText"):
        return GOOGLE_V3
    return _ADMITTING.get(path)
