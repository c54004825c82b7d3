"""FastAPI dependencies: how a route finds the runtime and translator of its own app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.runtime import Runtime
from service.translation.translator import Translator


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_translator(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Translator:
    """The ready translator; raises ``NotReady``/``EngineUnavailable`` otherwise."""
    return runtime.translator


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
TranslatorDep = Annotated[Translator, Depends(get_translator)]
