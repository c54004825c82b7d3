"""The engine's loading thread: where the model is loaded and, at the end, released.

The engine runs its own step thread once loaded; loading (minutes of reading weights, compiling
and capturing graphs) and closing happen on this one, so the event loop never runs torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from service.contract.types import Engine


class EngineWorker:
    """Owns one engine and the thread it is loaded and closed on."""

    def __init__(self, load: Callable[[], Engine]) -> None:
        self._load = load
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._engine: Engine | None = None

    async def start(self) -> Engine:
        """Load the engine on the worker thread and return it."""
        loop = asyncio.get_running_loop()
        self._engine = await loop.run_in_executor(self._executor, self._load)
        return self._engine

    async def close(self) -> None:
        """Release the engine on its thread, then stop the thread."""
        if self._engine is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._engine.close)
            self._engine = None
        self._executor.shutdown(wait=False, cancel_futures=True)
