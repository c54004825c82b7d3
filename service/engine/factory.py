"""The production engine loader: the model loaded and driven by the fast engine.

Runs in the engine process, on its worker thread. A loader is any picklable callable from an
``EngineConfig`` to an engine (multiprocessing spawn sends it to the child by reference); tests
pass their own fakes the same way. The model code is imported inside ``load_engine``: the API
process names this function as its default loader and must not import torch by doing so.
"""

from __future__ import annotations

from service.config.engine import EngineConfig, EngineLoader
from service.contract.types import Engine
from service.logs import route_library_logs

__all__ = ["EngineLoader", "load_engine"]


def load_engine(config: EngineConfig) -> Engine:
    """Load the model and wrap it in the fast engine."""
    from service.engine.fast.engine import FastEngine
    from service.engine.loading import load_model

    route_library_logs()  # before the load: transformers' and torch's records as JSON lines
    return FastEngine(load_model(config), config)
