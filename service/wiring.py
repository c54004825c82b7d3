"""The edge where the two processes' code meets: the engine process's entry, and the app built
with it.

The API process's own code (``service.frontend``) never imports the engine package; it is
given the engine's entry (``EngineEntry``) from here. Importing this module imports the engine
host (sockets and asyncio, no torch): torch is imported only inside the engine process.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI

from service.config.engine import EngineEntry, EngineLoader
from service.config.settings import Settings
from service.engine.host import run_engine
from service.frontend.app import create_app


def engine_entry(loader: EngineLoader | None = None) -> EngineEntry:
    """The engine process's entry, with ``loader`` building its engine (default: the model
    the settings name, on the fast engine)."""
    return run_engine if loader is None else functools.partial(run_engine, loader=loader)


def create_service(
    settings: Settings, loader: EngineLoader | None = None, **options: Any
) -> FastAPI:
    """The app on ``settings`` with its engine process's entry; ``options`` go to
    ``create_app``."""
    return create_app(settings, entry=engine_entry(loader), **options)
