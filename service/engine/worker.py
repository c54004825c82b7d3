"""The engine's dedicated thread: the only place the model is loaded and run.

One thread, so CUDA work is serialized and the event loop never runs torch. ``EngineWorker``
loads the engine on that thread and hands batches to it, answering through asyncio futures.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from service.engine.types import ContinuousEngine, Engine, GenerationRequest, GenerationResult
from service.errors import EngineUnavailable, OutOfMemory


class EngineWorker:
    """Owns one engine and the single thread it runs on."""

    def __init__(self, load: Callable[[], Engine | ContinuousEngine]) -> None:
        self._load = load
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._engine: Engine | ContinuousEngine | None = None

    async def start(self) -> Engine | ContinuousEngine:
        """Load the engine on the worker thread and return it."""
        loop = asyncio.get_running_loop()
        self._engine = await loop.run_in_executor(self._executor, self._load)
        return self._engine

    async def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        engine = self._engine
        if not isinstance(engine, Engine):
            raise EngineUnavailable("no batch engine is loaded")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, engine.generate, batch)
        except Exception as error:
            # Whatever engine raised it: the scheduler splits batches on this domain error. An
            # engine that never imported torch cannot have raised torch's error.
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(error, torch.OutOfMemoryError):
                raise OutOfMemory(f"out of memory generating a batch of {len(batch)}") from error
            raise

    async def close(self) -> None:
        """Release the engine on its thread (after a running batch), then stop the thread."""
        if self._engine is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._engine.close)
            self._engine = None
        self._executor.shutdown(wait=False, cancel_futures=True)
