"""Who may call the service and how much: API keys, request rate and character quota.

Keys come from ``HYMT_API_KEYS`` and/or a file (one per line, ``#`` comments), are compared in
constant time against every configured key, and never appear in logs: a client is known by a
short hash of its key (or by its address when no keys are configured). Rates and quotas use the
``limits`` library's sliding-window counters, per client, so one client's burst spends only its
own allowance.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from dataclasses import dataclass

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from service.errors import Forbidden, QuotaExceeded, RateLimited, Unauthenticated

# The bound of the counting window when no quota is set: never reached.
_UNLIMITED = 10**15


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
    def __init__(self, settings: AccessConfig) -> None:
        self._keys = [key.encode() for key in settings.api_keys]
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._rate: RateLimitItem | None = (
            parse(settings.rate_limit) if settings.rate_limit else None
        )
        self._chars: RateLimitItem | None = (
            parse(settings.char_quota) if settings.char_quota else None
        )
        # Without a quota, characters are still counted (DeepL's /v2/usage reports them), in a
        # window of DeepL's billing period.
        self._usage: RateLimitItem = self._chars or parse(f"{_UNLIMITED}/month")

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

    def admit(self, client: Client) -> None:
        """Count one request against the client's rate; ``RateLimited`` when it is spent."""
        if self._rate is not None:
            self._spend(self._rate, client, 1, "request rate")

    def charge(self, client: Client, characters: int) -> None:
        """Count characters against the client's quota; ``RateLimited`` when it is spent."""
        if characters <= 0:
            return
        if self._chars is not None:
            self._spend(self._chars, client, characters, "character quota")
        else:
            self._limiter.hit(self._usage, client.identity, cost=characters)

    def character_usage(self, client: Client) -> tuple[int, int | None]:
        """Characters used in the current window (the quota's, else a month) and the quota
        (None: unlimited)."""
        stats = self._limiter.get_window_stats(self._usage, client.identity)
        used = self._usage.amount - stats.remaining
        return used, self._chars.amount if self._chars is not None else None

    def _spend(self, item: RateLimitItem, client: Client, cost: int, what: str) -> None:
        if self._limiter.hit(item, client.identity, cost=cost):
            return
        reset = self._limiter.get_window_stats(item, client.identity).reset_time
        error = QuotaExceeded if item is self._chars else RateLimited
        raise error(
            f"{what} of {item} spent for this client",
            retry_after_s=max(1.0, math.ceil(reset - time.time())),
        )
