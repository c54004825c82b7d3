"""FastAPI dependencies: how a route finds the runtime and translator of its own app."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Header, Request

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


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
DeadlineDep = Annotated[float, Depends(get_deadline)]
TranslatorDep = Annotated[Translator, Depends(get_translator)]
