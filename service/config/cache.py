"""The result cache, and the Redis that replicas share state through."""

from __future__ import annotations

from pydantic import Field

from service.config.section import Section


class CacheSettings(Section):
    cache_size: int = Field(10_000, ge=0, description="Most cached translations (0 = no cache).")
    cache_ttl_s: float = Field(3600.0, gt=0, description="Seconds a cached translation lives.")
    redis_url: str | None = Field(
        None,
        description="Shared state of several replicas (redis://host:6379/0): rate limits, "
        "character quotas and a second-level result cache. Unset: each process has its own.",
    )
