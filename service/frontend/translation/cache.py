"""The result cache: finished translations by an exact key, and generations in flight.

Keys are tuples of every input that changes the output (model fingerprint, prompt format name,
rendered prompt, decoding settings, token budget). Tuples compare field by field, so no two
different requests can share a key, unlike keys joined from strings (``"a|b"`` vs ``["a", "b"]``).

Identical requests that arrive while the first is still generating share its task instead of
queueing a second generation; when every waiter has gone, the shared task is cancelled. An
optional second level (the replicas' shared cache in Redis) is asked before generating, and
given what was generated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from cachetools import TTLCache

T = TypeVar("T")


class SecondLevel(Protocol[T]):
    """A cache behind this one (``frontend.shared.SharedCache``): misses cost a lookup there."""

    async def get(self, key: Hashable) -> T | None: ...

    async def put(self, key: Hashable, value: T) -> None: ...


@dataclass(slots=True)
class _Flight(Generic[T]):
    # The value, and whether it came from the second level rather than ``produce``.
    task: asyncio.Task[tuple[T, bool]]
    waiters: int = field(default=0)


class ResultCache(Generic[T]):
    """An LRU cache with a TTL in front of a producer, with in-flight deduplication.

    ``get_or_create`` returns ``(value, source)`` where source is ``"hit"`` (this cache or the
    second level),
    ``"shared"`` (joined an identical generation in flight) or ``"miss"`` (ran ``produce``).
    Failures are not cached.
    """

    def __init__(
        self,
        maxsize: int,
        ttl_s: float,
        timer: Callable[[], float] | None = None,
        second: SecondLevel[T] | None = None,
    ) -> None:
        self._second = second
        self._cache: TTLCache[Hashable, T] | None = (
            TTLCache(maxsize=maxsize, ttl=ttl_s, timer=timer or time.monotonic)
            if maxsize > 0
            else None
        )
        self._flights: dict[Hashable, _Flight[T]] = {}

    def __len__(self) -> int:
        return len(self._cache) if self._cache is not None else 0

    def get(self, key: Hashable) -> T | None:
        return self._cache.get(key) if self._cache is not None else None

    async def get_or_create(
        self, key: Hashable, produce: Callable[[], Awaitable[T]]
    ) -> tuple[T, str]:
        cached = self.get(key)
        if cached is not None:
            return cached, "hit"
        flight = self._flights.get(key)
        source = "shared"
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._produce(key, produce)))
            self._flights[key] = flight
            source = "miss"
        flight.waiters += 1
        try:
            # shield: one waiter leaving (client gone) must not cancel the others' generation.
            value, second_hit = await asyncio.shield(flight.task)
            return value, "hit" if second_hit and source == "miss" else source
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()
                self._flights.pop(key, None)

    async def _produce(self, key: Hashable, produce: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        try:
            value = await self._second.get(key) if self._second is not None else None
            second_hit = value is not None
            if value is None:
                value = await produce()
                if self._second is not None:
                    await self._second.put(key, value)
            if self._cache is not None:
                self._cache[key] = value
            return value, second_hit
        finally:
            self._flights.pop(key, None)
