"""The result cache: exact keys, LRU eviction, TTL, and sharing of identical generations."""

from __future__ import annotations

import asyncio

import pytest

from service.frontend.translation.cache import ResultCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def producer(value: str, calls: list[str], delay: float = 0.0):  # type: ignore[no-untyped-def]
    async def produce() -> str:
        calls.append(value)
        await asyncio.sleep(delay)
        return value

    return produce


async def test_hit_after_miss() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)
    calls: list[str] = []
    assert await cache.get_or_create(("k",), producer("v", calls)) == ("v", "miss")
    assert await cache.get_or_create(("k",), producer("other", calls)) == ("v", "hit")
    assert calls == ["v"]


async def test_keys_that_join_to_the_same_string_stay_apart() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)
    calls: list[str] = []
    await cache.get_or_create(("a|b",), producer("joined", calls))
    value, origin = await cache.get_or_create(("a", "b"), producer("pair", calls))
    assert (value, origin) == ("pair", "miss")


async def test_least_recently_used_entry_is_evicted() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=2, ttl_s=60)
    calls: list[str] = []
    await cache.get_or_create(("a",), producer("a", calls))
    await cache.get_or_create(("b",), producer("b", calls))
    await cache.get_or_create(("a",), producer("a", calls))  # a is now most recent
    await cache.get_or_create(("c",), producer("c", calls))  # evicts b
    assert cache.get(("a",)) == "a"
    assert cache.get(("b",)) is None
    assert len(cache) == 2


async def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=5, timer=clock)
    await cache.get_or_create(("k",), producer("v", []))
    clock.now = 4.9
    assert cache.get(("k",)) == "v"
    clock.now = 5.1
    assert cache.get(("k",)) is None


async def test_concurrent_identical_requests_share_one_generation() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)
    calls: list[str] = []
    results = await asyncio.gather(
        *(cache.get_or_create(("k",), producer("v", calls, delay=0.05)) for _ in range(5))
    )
    assert calls == ["v"]
    assert sorted(origin for _, origin in results) == [
        "miss",
        "shared",
        "shared",
        "shared",
        "shared",
    ]


async def test_sharing_works_with_the_cache_disabled() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=0, ttl_s=60)
    calls: list[str] = []
    await asyncio.gather(
        *(cache.get_or_create(("k",), producer("v", calls, 0.05)) for _ in range(3))
    )
    assert calls == ["v"]
    await cache.get_or_create(("k",), producer("v", calls))
    assert calls == ["v", "v"]  # nothing stored


async def test_one_waiter_leaving_does_not_cancel_the_others() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)
    calls: list[str] = []
    first = asyncio.ensure_future(cache.get_or_create(("k",), producer("v", calls, 0.05)))
    second = asyncio.ensure_future(cache.get_or_create(("k",), producer("v", calls, 0.05)))
    await asyncio.sleep(0.01)
    first.cancel()
    assert await second == ("v", "shared")


async def test_generation_is_cancelled_when_every_waiter_left() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)
    finished: list[str] = []

    async def slow() -> str:
        await asyncio.sleep(0.2)
        finished.append("done")
        return "v"

    waiter = asyncio.ensure_future(cache.get_or_create(("k",), slow))
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.sleep(0.3)
    assert finished == []
    assert cache.get(("k",)) is None


async def test_failures_are_not_cached() -> None:
    cache: ResultCache[str] = ResultCache(maxsize=10, ttl_s=60)

    async def broken() -> str:
        raise ValueError("nope")

    with pytest.raises(ValueError, match="nope"):
        await cache.get_or_create(("k",), broken)
    assert await cache.get_or_create(("k",), producer("v", [])) == ("v", "miss")
