"""DeepL API v2-compatible endpoints, mounted under ``/v2``.

``POST /v2/translate`` (JSON or form, ``text`` repeated), ``GET /v2/languages``,
``GET /v2/usage``, ``Authorization: DeepL-Auth-Key KEY`` against the same key store as the native
API, errors as ``{"message": ...}`` with DeepL's codes (400, 403, 413 over 128 KiB, 429, 456 when
a key's character quota is spent). Options the model cannot honour are refused with a 400 that
names them; options that cannot change a single-segment translation are accepted and ignored
(listed in the README).
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, field_validator

from service.access import AccessControl
from service.api.context import RequestContext
from service.api.errors import Dialect, install_dialect_errors
from service.api.middleware import NO_TELEMETRY
from service.api.params import Params, parse, read_params
from service.errors import (
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    PayloadTooLarge,
    QuotaExceeded,
    ServiceError,
    Unauthenticated,
    Unsupported,
)
from service.runtime import Runtime
from service.translation.languages import Language, LanguageTable

MAX_REQUEST_BYTES = 128 * 1024
# Parameters whose effect the model cannot produce: refused, never half-applied.
REFUSED = (
    "glossary_id",
    "glossary_ids",
    "style_id",
    "style_rule",
    "custom_instructions",
    "translation_memory",
    "translation_memory_id",
)
_STATUS = {
    InvalidInput: 400,
    Unauthenticated: 403,
    Forbidden: 403,
    QuotaExceeded: 456,
    DeadlineExceeded: 504,
}
# DeepL spellings that are not simply our code in capitals.
_TO_OURS = {"EN-US": "en", "EN-GB": "en", "PT-BR": "pt", "PT-PT": "pt", "ZH-HANS": "zh"}
DEEPL = Dialect("/v2", _STATUS, lambda error: {"message": error.message})


class TranslateBody(BaseModel):
    # DeepL accepts many options that cannot change a one-segment translation: ignored.
    model_config = ConfigDict(extra="ignore")

    text: list[str]
    target_lang: str
    source_lang: str | None = None
    tag_handling: Literal["html", "xml"] | None = None
    formality: str | None = None
    auth_key: str | None = None

    @field_validator("text", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("source_lang", "tag_handling", "formality", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return value or None


def deepl_code(language: Language) -> str:
    return language.code.upper()


def our_code(deepl: str) -> str:
    upper = deepl.upper()
    return _TO_OURS.get(upper, upper.lower() if upper != "ZH-HANT" else "zh-Hant")


def create_deepl_app(runtime: Runtime, access: AccessControl) -> FastAPI:
    app = FastAPI(
        title="DeepL-compatible API v2", docs_url=None, redoc_url=None, telemetry=NO_TELEMETRY
    )
    app.state.runtime, app.state.access = runtime, access

    install_dialect_errors(app, DEEPL)

    def context_of(request: Request, params: Params | None = None) -> RequestContext:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme != "DeepL-Auth-Key" and params is not None:
            given = params.get("auth_key")
            key = given if isinstance(given, str) else ""
        return RequestContext.build(request, f"Bearer {key}" if key else None)

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        if len(await request.body()) > MAX_REQUEST_BYTES:
            raise PayloadTooLarge("Request Entity Too Large")
        params = await read_params(request)
        refused = [name for name in REFUSED if params.get(name)]
        body = parse(TranslateBody, params)
        context = context_of(request, params)
        if body.formality not in (None, "default"):
            refused.append("formality")
        if refused:
            raise Unsupported(f"unsupported parameter(s): {', '.join(refused)}")
        texts = body.text
        if not texts:
            raise InvalidInput("invalid request: missing text parameter")
        billed = sum(len(text) for text in texts)
        context.charge(billed)
        translator = context.translator
        target_code = our_code(body.target_lang)
        source_code = our_code(body.source_lang) if body.source_lang else None
        if body.tag_handling:
            outcomes = await translator.translate_markup(
                texts, target_code, source_code, deadline=context.deadline
            )
        else:
            outcomes = await translator.translate_batch(
                texts, target_code, source_code, deadline=context.deadline
            )
        translations = []
        for text, outcome in zip(texts, outcomes, strict=True):
            if isinstance(outcome, ServiceError):
                raise outcome
            detected = outcome.source or translator.languages["en"]
            translations.append(
                {
                    "detected_source_language": deepl_code(detected),
                    "text": outcome.text,
                    "billed_characters": len(text),
                }
            )
        return JSONResponse({"translations": translations})

    @app.get("/languages")
    async def languages(request: Request, type: str = "source") -> JSONResponse:
        table: LanguageTable = context_of(request).translator.languages
        entries: list[dict[str, object]] = []
        for language in table.values():
            entry: dict[str, object] = {
                "language": deepl_code(language),
                "name": language.english_name,
            }
            if type == "target":
                entry["supports_formality"] = False
            entries.append(entry)
        return JSONResponse(entries)

    @app.get("/usage")
    async def usage(request: Request) -> JSONResponse:
        context = context_of(request)
        used, limit = access.character_usage(context.client)
        return JSONResponse(
            {"character_count": used, "character_limit": limit if limit is not None else 10**12}
        )

    return app
