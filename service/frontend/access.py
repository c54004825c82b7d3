"""Who may call the service and how much: API keys, request rate and character quota.

Keys come from ``HYMT_API_KEYS`` and/or a file (one per line, ``#`` comments), are compared in
constant time against every configured key, and never appear in logs: a client is known by a
short hash of its key (or by its address when no keys are configured). Rates and quotas use the
``limits`` library's sliding-window counters, per client, so one client's burst spends only its
own allowance. With Redis (``frontend.shared``) the counters are shared by every replica and API
process, so a client spread over them gets exactly its allowance. Without Redis the API
processes of one host share a file of counters (``local_limits``), with the same effect on one
host; while Redis is away a replica counts on its own host, and shares again when it is back.

Requests and characters are counted on a thread of their own (``AccessControl.admit``,
``charge``): the counters live in a file or in Redis shared with other processes, whose
statements wait for each other's locks (a file's contended write sleeps a millisecond or more),
and on the event loop that wait would hold up every request the process reads meanwhile, the
refusals of a flood among them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from limits import RateLimitItem, parse
from limits.errors import StorageError
from limits.storage import MemoryStorage, RedisStorage, Storage
from limits.strategies import SlidingWindowCounterRateLimiter
from limits.util import WindowStats

from service.contract.errors import Forbidden, QuotaExceeded, RateLimited, Unauthenticated
from service.frontend.shared import Redis

# The bound of the counting window when no quota is set: never reached.
_UNLIMITED = 10**15

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AccessConfig:
    """Accepted keys (none: open) and per-client limits in the limits library's notation."""

    api_keys: tuple[str, ...] = ()
    rate_limit: str | None = None
    char_quota: str | None = None


@dataclass(frozen=True, slots=True)
class Client:
    """An authenticated caller: ``identity`` is safe to log and to key quotas on."""

    identity: str


class AccessControl:
    def __init__(
        self, settings: AccessConfig, redis: Redis | None = None, local: Storage | None = None
    ) -> None:
        """``local``: the counters of this host's API processes (``local_limits``), where
        there are several; this process's memory otherwise."""
        self._keys = [key.encode() for key in settings.api_keys]
        self._limiter = SlidingWindowCounterRateLimiter(local or MemoryStorage())
        self._redis = redis
        self._shared = (
            SlidingWindowCounterRateLimiter(
                RedisStorage(
                    redis.url,
                    wrap_exceptions=True,
                    key_prefix=f"{redis.config.prefix}limits",
                    socket_timeout=redis.timeout_s,
                    socket_connect_timeout=redis.timeout_s,
                )
            )
            if redis is not None
            else None
        )
        self._rate: RateLimitItem | None = (
            parse(settings.rate_limit) if settings.rate_limit else None
        )
        self._chars: RateLimitItem | None = (
            parse(settings.char_quota) if settings.char_quota else None
        )
        # Without a quota, characters are still counted (DeepL's /v2/usage reports them), in a
        # window of DeepL's billing period.
        self._usage: RateLimitItem = self._chars or parse(f"{_UNLIMITED}/month")
        # One thread, so counts are made in the order they were asked for: a usage read after
        # a charge sees it.
        self._counting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hymt-counting")

    @property
    def requires_keys(self) -> bool:
        return bool(self._keys)

    def authenticate(self, authorization: str | None, address: str) -> Client:
        """The client behind an ``Authorization: Bearer KEY`` header (or its address)."""
        if not self._keys:
            return Client(identity=f"addr:{address}")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthenticated("an API key is required: Authorization: Bearer <key>")
        candidate = given.strip().encode()
        matched = False
        for key in self._keys:  # no early exit: the time taken does not say which key matched
            matched |= hmac.compare_digest(candidate, key)
        if not matched:
            raise Forbidden("the API key is not valid")
        return Client(identity="key:" + hashlib.sha256(candidate).hexdigest()[:12])

    async def admit(self, client: Client) -> None:
        """Count one request against the client's rate, on the counting thread; ``RateLimited``
        when it is spent."""
        if self._rate is not None:
            await asyncio.wrap_future(
                self._counting.submit(self._spend, self._rate, client, 1, "request rate")
            )

    async def charge(self, client: Client, characters: int) -> None:
        """Count characters against the client's quota on the counting thread;
        ``QuotaExceeded`` when it is spent. Without a quota nothing can refuse them, so they
        are counted (for ``character_usage``) without the request waiting."""
        if characters <= 0:
            return
        if self._chars is None:
            self._counting.submit(self._hit, self._usage, client, characters).add_done_callback(
                _report_failure
            )
            return
        await asyncio.wrap_future(
            self._counting.submit(self._spend, self._chars, client, characters, "character quota")
        )

    async def character_usage(self, client: Client) -> tuple[int, int | None]:
        """Characters used in the current window (the quota's, else a month), every charge made
        before counted, and the quota (None: unlimited)."""
        stats = await asyncio.wrap_future(self._counting.submit(self._stats, self._usage, client))
        used = self._usage.amount - stats.remaining
        return used, self._chars.amount if self._chars is not None else None

    def close(self) -> None:
        """Wait for the counts asked for, then let the counting thread go."""
        self._counting.shutdown(wait=True)

    def _hit(self, item: RateLimitItem, client: Client, cost: int) -> bool:
        """Spend ``cost`` of ``item`` in the shared counters, or the local ones while Redis
        is away."""
        if self._shared is not None and self._redis is not None and self._redis.usable():
            try:
                allowed = self._shared.hit(item, client.identity, cost=cost)
            except StorageError as error:
                self._redis.failed(error)
            else:
                self._redis.succeeded()
                return allowed
        return self._limiter.hit(item, client.identity, cost=cost)

    def _stats(self, item: RateLimitItem, client: Client) -> WindowStats:
        if self._shared is not None and self._redis is not None and self._redis.usable():
            try:
                stats = self._shared.get_window_stats(item, client.identity)
            except StorageError as error:
                self._redis.failed(error)
            else:
                self._redis.succeeded()
                return stats
        return self._limiter.get_window_stats(item, client.identity)

    def _spend(self, item: RateLimitItem, client: Client, cost: int, what: str) -> None:
        if self._hit(item, client, cost):
            return
        reset = self._stats(item, client).reset_time
        error = QuotaExceeded if item is self._chars else RateLimited
        raise error(
            f"{what} of {item} spent for this client",
            retry_after_s=max(1.0, math.ceil(reset - time.time())),
        )


def _report_failure(counted: Future[bool]) -> None:
    """A count nobody waits for: its failure (the counters' storage unreadable) is logged."""
    error = counted.exception()
    if error is not None:
        _log.warning("characters not counted", exc_info=error)
