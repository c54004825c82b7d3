"""DeepL API v2-compatible endpoints, mounted under ``/v2``.

``POST /v2/translate`` (JSON or form, ``text`` repeated), ``GET /v2/languages``,
``GET /v2/usage``, ``Authorization: DeepL-Auth-Key KEY`` against the same key store as the native
API, errors as ``{"message": ...}`` with DeepL's codes (400, 403, 413 over 128 KiB, 429, 456 when
a key's character quota is spent). Options the model cannot honour are refused with a 400 that
names them; options that cannot change a single-segment translation are accepted and ignored
(listed in the README).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.access import AccessControl, Client
from service.api.errors import install_dialect_errors
from service.api.params import Params, optional_text, read_params, text_list
from service.errors import (
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
_STATUS = {InvalidInput: 400, Unauthenticated: 403, Forbidden: 403, QuotaExceeded: 456}
# DeepL spellings that are not simply our code in capitals.
_TO_OURS = {"EN-US": "en", "EN-GB": "en", "PT-BR": "pt", "PT-PT": "pt", "ZH-HANS": "zh"}


def deepl_code(language: Language) -> str:
    return language.code.upper()


def our_code(deepl: str) -> str:
    upper = deepl.upper()
    return _TO_OURS.get(upper, upper.lower() if upper != "ZH-HANT" else "zh-Hant")


def create_deepl_app(runtime: Runtime, access: AccessControl) -> FastAPI:
    app = FastAPI(title="DeepL-compatible API v2", docs_url=None, redoc_url=None)

    install_dialect_errors(app, _STATUS, lambda error: {"message": error.message})

    def client_of(request: Request, params: Params | None = None) -> Client:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme != "DeepL-Auth-Key" and params is not None:
            key = optional_text(params, "auth_key") or ""
        address = request.client.host if request.client else "unknown"
        client = access.authenticate(f"Bearer {key}" if key else None, address)
        access.admit(client)
        return client

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        if len(await request.body()) > MAX_REQUEST_BYTES:
            raise PayloadTooLarge("Request Entity Too Large")
        params = await read_params(request)
        client = client_of(request, params)
        refused = [name for name in REFUSED if params.get(name)]
        formality = optional_text(params, "formality")
        if formality not in (None, "default"):
            refused.append("formality")
        if refused:
            raise Unsupported(f"unsupported parameter(s): {', '.join(refused)}")
        texts = text_list(params.get("text"), "text")
        target = optional_text(params, "target_lang")
        if target is None:
            raise InvalidInput("Value for 'target_lang' not supported.")
        source = optional_text(params, "source_lang")
        tags = optional_text(params, "tag_handling")
        if tags not in (None, "html", "xml"):
            raise InvalidInput(f"Value for 'tag_handling' not supported: {tags}")
        billed = sum(len(text) for text in texts)
        access.charge(client, billed)
        translator = runtime.translator
        target_code, source_code = our_code(target), our_code(source) if source else None
        if tags:
            outcomes = await translator.translate_markup(texts, target_code, source_code)
        else:
            outcomes = await translator.translate_batch(texts, target_code, source_code)
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
        client_of(request)
        table: LanguageTable = runtime.translator.languages
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
        client = client_of(request)
        used, limit = access.character_usage(client)
        return JSONResponse(
            {"character_count": used, "character_limit": limit if limit is not None else 10**12}
        )

    return app
