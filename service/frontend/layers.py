"""Each layer of the API process's own config, built from the settings' sub-models: the one
place the frontend's layers meet ``Settings``."""

from __future__ import annotations

from service.config.settings import Settings
from service.frontend.access import AccessConfig
from service.frontend.documents.formats import PackageLimits
from service.frontend.documents.jobs import JobLimits
from service.frontend.documents.reading import ReadingConfig
from service.frontend.documents.runner import RunnerConfig
from service.frontend.documents.service import DocumentsConfig
from service.frontend.glossaries import GlossaryLimits
from service.frontend.policy.config import PolicyConfig
from service.frontend.shared import RedisConfig
from service.frontend.translation.results import TranslationConfig


def policy_config(settings: Settings) -> PolicyConfig:
    reliability = settings.reliability
    return PolicyConfig(
        max_in_flight=settings.limits.max_queue_size,
        processes=settings.server.processes,
        max_new_tokens=settings.decoding.max_new_tokens,
        request_timeout_s=reliability.request_timeout_s,
        min_request_timeout_s=reliability.min_request_timeout_s,
        stall_timeout_s=reliability.stall_timeout_s,
        heartbeat_timeout_s=reliability.engine_heartbeat_timeout_s,
        start_timeout_s=reliability.engine_start_timeout_s,
        max_restarts=reliability.engine_max_restarts,
    )


def translation_config(settings: Settings) -> TranslationConfig:
    limits, decoding, spec = settings.limits, settings.decoding, settings.model_spec()
    return TranslationConfig(
        decoding=settings.generation_defaults(),
        max_text_chars=limits.max_text_chars,
        max_input_tokens=limits.max_input_tokens,
        max_prompt_tokens=limits.prompt_tokens,
        max_batch_items=limits.max_batch_items,
        max_new_tokens=decoding.max_new_tokens,
        output_tokens_ratio=decoding.output_tokens_ratio,
        output_tokens_margin=decoding.output_tokens_margin,
        log_texts=settings.observability.log_texts,
        cache_size=settings.cache.cache_size,
        cache_ttl_s=settings.cache.cache_ttl_s,
        warmup=settings.model.warmup,
        prepare_niceness=settings.server.prepare_niceness,
        prepare_timeout_s=settings.reliability.prepare_timeout_s,
        family=spec.family,
        max_document_chars=limits.max_document_chars,
        think_tags=spec.chat_format == "hy-v3",
    )


def redis_config(settings: Settings) -> RedisConfig:
    return RedisConfig(url=settings.cache.redis_url, cache_ttl_s=settings.cache.cache_ttl_s)


def glossary_limits(settings: Settings) -> GlossaryLimits:
    documents = settings.documents
    return GlossaryLimits(
        max_glossaries=documents.max_glossaries_per_key,
        max_bytes=documents.max_glossary_bytes_per_key,
    )


def documents_config(settings: Settings) -> DocumentsConfig:
    documents = settings.documents
    return DocumentsConfig(
        max_file_bytes=documents.max_file_bytes,
        max_file_chars=documents.max_file_chars,
        reading=ReadingConfig(
            chunk_chars=settings.limits.max_document_chars,
            package=PackageLimits(max_unpacked_bytes=documents.max_unpacked_bytes),
            at_once=documents.document_reads,
            timeout_s=documents.document_read_timeout_s,
            memory_bytes=documents.document_read_memory_mib * 2**20,
        ),
        public_origin=documents.public_origin,
        limits=JobLimits(
            max_jobs_per_client=documents.max_documents_per_key, ttl_s=documents.document_ttl_s
        ),
        runner=RunnerConfig(
            max_running=documents.document_jobs,
            unit_timeout_s=settings.reliability.request_timeout_s,
        ),
    )


def access_config(settings: Settings) -> AccessConfig:
    access = settings.access
    return AccessConfig(
        api_keys=access.keys(), rate_limit=access.rate_limit, char_quota=access.char_quota
    )
