"""FastAPI dependencies: how a route finds the runtime and translator of its own app."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Header, Request

from service.access import AccessControl, Client
from service.runtime import Runtime
from service.translation.translator import Translator


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_translator(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Translator:
    """The ready translator; raises ``NotReady``/``EngineUnavailable`` otherwise."""
    return runtime.translator


def get_deadline(
    runtime: Annotated[Runtime, Depends(get_runtime)],
    x_request_timeout: Annotated[
        float | None,
        Header(
            gt=0,
            description="Seconds this request may take; lowers the server's own deadline.",
        ),
    ] = None,
) -> float:
    """The request's deadline as a ``time.monotonic()`` instant."""
    seconds = runtime.settings.request_timeout_s
    if x_request_timeout is not None:
        seconds = min(seconds, x_request_timeout)
    return time.monotonic() + seconds


def get_access(request: Request) -> AccessControl:
    access: AccessControl = request.app.state.access
    return access


def get_client(
    request: Request,
    access: Annotated[AccessControl, Depends(get_access)],
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Client:
    """The authenticated caller, with one request counted against its rate."""
    address = request.client.host if request.client else "unknown"
    client = access.authenticate(authorization, address)
    access.admit(client)
    return client


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
AccessDep = Annotated[AccessControl, Depends(get_access)]
ClientDep = Annotated[Client, Depends(get_client)]
DeadlineDep = Annotated[float, Depends(get_deadline)]
TranslatorDep = Annotated[Translator, Depends(get_translator)]
