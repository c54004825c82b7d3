"""The production engine loader: the transformers model driven by the engine the config asks for.

Runs in the engine process, on its worker thread. A loader is any picklable callable from an
``EngineConfig`` to an engine (multiprocessing spawn sends it to the child by reference); tests
pass their own fakes the same way. The model code is imported inside ``load_engine``: the API
process names this function as its default loader and must not import torch by doing so.
"""

from __future__ import annotations

from service.engine.config import EngineConfig
from service.engine.types import AnyEngine, EngineLoader

__all__ = ["EngineLoader", "engine_kind", "load_engine"]


def engine_kind(config: EngineConfig, device_type: str) -> str:
    """``auto`` is the fast engine on CUDA, static micro-batches elsewhere. On CUDA it is
    transformers' continuous batching for bitsandbytes weights, which the fast engine's
    projections cannot read; every model of the family, the mixture of experts included, takes
    the fast engine."""
    if config.engine != "auto":
        return config.engine
    if device_type != "cuda":
        return "static"
    if config.quantization in ("nf4", "int8"):
        return "continuous"
    return "fast"


def load_engine(config: EngineConfig) -> AnyEngine:
    """Load the model and wrap it in the engine that ``config.engine`` resolves to."""
    from service.engine.continuous import ContinuousBatchingEngine
    from service.engine.fast.engine import FastEngine
    from service.engine.loading import load_model, resolve_device
    from service.engine.static import StaticBatchEngine

    kind = engine_kind(config, resolve_device(config.device).type)
    config.check_kind(kind)  # before minutes of loading, not after
    loaded = load_model(config)
    if kind == "fast":
        return FastEngine(loaded, config)
    if kind == "continuous":
        return ContinuousBatchingEngine(loaded, config)
    return StaticBatchEngine(loaded)
