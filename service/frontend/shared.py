"""Shared state through Redis (``HYMT_REDIS_URL``): what replicas and API processes share, and
what happens when Redis is away.

``Redis`` holds the connection settings and one circuit: after a failed call, Redis is "down"
for ``retry_s`` and every caller uses its local fallback at once (no call waits on a dead
server); the first call after that tries again, and a success brings it back. Its state is the
``hymt_redis_up`` gauge and a field of ``/health``.

``SharedCache`` is the second level of the result cache: a translation made on one replica is
a hit on another. An entry stores its full key beside the value and is used only when the key
is equal, so two keys whose hashes collide can never share an answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis
import redis.asyncio

from service.frontend.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

# Redis is on the local network: a call that takes longer than this means it is away.
_TIMEOUT_S = 0.25


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str | None = None
    retry_s: float = 2.0
    cache_ttl_s: float = 3600.0
    prefix: str = "hymt:"


class Redis:
    """The connection settings and the circuit shared by every user of Redis in a process."""

    def __init__(self, config: RedisConfig, metrics: Metrics) -> None:
        assert config.url is not None
        self.config = config
        self.url = config.url
        self.metrics = metrics
        self._down_until = 0.0
        self._up = True
        metrics.redis_up.set(1)
        self.timeout_s = _TIMEOUT_S
        self._async: redis.asyncio.Redis | None = None

    @property
    def up(self) -> bool:
        return self._up

    def usable(self) -> bool:
        """Whether to try Redis now (it is up, or its pause after a failure is over)."""
        return self._up or time.monotonic() >= self._down_until

    def failed(self, error: BaseException) -> None:
        if self._up:
            log.warning("redis unavailable: using local state", extra={"error": repr(error)})
        self._up = False
        self._down_until = time.monotonic() + self.config.retry_s
        self.metrics.redis_up.set(0)

    def succeeded(self) -> None:
        if not self._up:
            log.info("redis available again")
        self._up = True
        self.metrics.redis_up.set(1)

    def client(self) -> redis.asyncio.Redis:
        """The process's asyncio client (made on first use, in the event loop that uses it)."""
        if self._async is None:
            self._async = redis.asyncio.from_url(
                self.url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S
            )
        return self._async

    async def close(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


class SharedCache(Generic[T]):
    """Values by exact key in Redis, for ``ttl_s``; every failure is a miss, never an error."""

    def __init__(
        self,
        redis_: Redis,
        encode: Callable[[T], object],
        decode: Callable[[object], T],
        namespace: str,
    ) -> None:
        self._redis = redis_
        self._encode = encode
        self._decode = decode
        self._namespace = namespace

    def _name(self, key: Hashable) -> tuple[str, str]:
        text = repr(key)
        digest = hashlib.sha256(text.encode()).hexdigest()
        return f"{self._redis.config.prefix}{self._namespace}:{digest}", text

    async def get(self, key: Hashable) -> T | None:
        if not self._redis.usable():
            return None
        name, text = self._name(key)
        try:
            raw = await self._redis.client().get(name)
        except (redis.RedisError, OSError) as error:
            self._redis.failed(error)
            return None
        self._redis.succeeded()
        if raw is None:
            return None
        entry = json.loads(raw)
        if entry.get("key") != text:  # another key with the same hash: not ours
            return None
        self._redis.metrics.shared_cache_hits.inc()
        return self._decode(entry["value"])

    async def put(self, key: Hashable, value: T) -> None:
        if not self._redis.usable():
            return
        name, text = self._name(key)
        entry = json.dumps({"key": text, "value": self._encode(value)})
        try:
            await self._redis.client().set(name, entry, ex=int(self._redis.config.cache_ttl_s))
        except (redis.RedisError, OSError) as error:
            self._redis.failed(error)
            return
        self._redis.succeeded()
