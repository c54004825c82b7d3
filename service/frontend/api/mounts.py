"""A compatibility dialect's own app, mounted under its prefix on the service's app: no docs of
its own (``/docs`` is the service's), no telemetry, the runtime and keys every route reads, and
errors in the dialect's shape."""

from __future__ import annotations

from fastapi import FastAPI

from service.frontend.access import AccessControl
from service.frontend.api.errors import Dialect, install_dialect_errors
from service.frontend.api.middleware import NO_TELEMETRY
from service.frontend.runtime import Runtime


def dialect_app(title: str, runtime: Runtime, access: AccessControl, dialect: Dialect) -> FastAPI:
    app = FastAPI(title=title, docs_url=None, redoc_url=None, telemetry=NO_TELEMETRY)
    app.state.runtime, app.state.access = runtime, access
    install_dialect_errors(app, dialect)
    return app
