"""LibreTranslate-compatible API, mounted under ``/libretranslate``.

Answers LibreTranslate's request and response shapes exactly (``{"translatedText": ...}``,
``detectedLanguage`` with a percentage confidence, ``{"error": "..."}`` with its status codes) on
top of the same Translator, cache and scheduler as the native API. Unlike LibreTranslate, a list
of texts with ``source=auto`` is detected text by text.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.contract.errors import (
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    Overloaded,
    ServiceError,
    Unauthenticated,
)
from service.frontend.access import AccessControl
from service.frontend.api.context import RequestContext
from service.frontend.api.documents import install_libretranslate_file_routes
from service.frontend.api.errors import Dialect
from service.frontend.api.mounts import dialect_app
from service.frontend.api.params import Params, parse, read_params
from service.frontend.documents.formats import EXTENSIONS
from service.frontend.documents.service import Documents
from service.frontend.runtime import Runtime
from service.frontend.translation.markup import INLINE
from service.frontend.translation.results import Translation, every_translation
from service.frontend.translation.translator import Translator

# LibreTranslate's own status codes where they differ from the native API's.
_STATUS = {InvalidInput: 400, Unauthenticated: 403, Forbidden: 403, DeadlineExceeded: 504}


def _error_body(error: ServiceError) -> dict[str, str]:
    # LibreTranslate's clients recognise a 429 by this prefix.
    if isinstance(error, Overloaded):
        return {"error": f"Slowdown: {error.message}"}
    return {"error": error.message}


LIBRETRANSLATE = Dialect("/libretranslate", _STATUS, _error_body)
# LibreTranslate's answers for features this server does not offer.
_SUGGESTIONS_DISABLED = "Suggestions are disabled on this server."


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    api_key: str | None = None


class TranslateBody(_Request):
    q: str | list[str] = Field(min_length=1)
    source: str = "auto"
    target: str
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(0, ge=0, le=10)

    @field_validator("source", mode="before")
    @classmethod
    def _empty_is_auto(cls, value: object) -> object:
        return value or "auto"


class DetectBody(_Request):
    q: str = Field(min_length=1)


def create_libretranslate_app(
    runtime: Runtime, access: AccessControl, documents: Documents
) -> FastAPI:
    app = dialect_app("LibreTranslate-compatible API", runtime, access, LIBRETRANSLATE)

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await read_params(request)
        body = parse(TranslateBody, params)
        return JSONResponse(await _translate(body, await libretranslate_context(request, params)))

    install_libretranslate_file_routes(app, documents, libretranslate_context)

    @app.post("/detect")
    async def detect(request: Request) -> JSONResponse:
        params = await read_params(request)
        body = parse(DetectBody, params)
        context = await libretranslate_context(request, params)
        await context.charge(len(body.q))
        (detection,) = await context.translator.detect([body.q])
        return JSONResponse(
            [
                {
                    "confidence": round(detection.confidence * 100, 1),
                    "language": detection.language.code,
                }
            ]
        )

    @app.get("/languages")
    async def languages() -> JSONResponse:
        table = runtime.translator.languages
        codes = list(table)
        return JSONResponse(
            [
                {"code": lang.code, "name": lang.english_name, "targets": codes}
                for lang in table.values()
            ]
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        """LibreTranslate's own probe: whether translations can be served now."""
        if runtime.failure() is not None:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.post("/suggest")
    async def suggest() -> JSONResponse:
        raise Forbidden(_SUGGESTIONS_DISABLED)

    @app.get("/spec")
    async def spec() -> JSONResponse:
        """This API's OpenAPI document (LibreTranslate serves its Swagger document here)."""
        return JSONResponse(app.openapi())

    @app.get("/frontend/settings")
    async def frontend_settings() -> JSONResponse:
        return JSONResponse(_frontend_settings(runtime, access))

    return app


async def libretranslate_context(request: Request, params: Params) -> RequestContext:
    """The caller, from the ``Authorization`` header or LibreTranslate's ``api_key``."""
    key = params.get("api_key")
    header = request.headers.get("authorization") or (
        f"Bearer {key}" if isinstance(key, str) and key else None
    )
    return await RequestContext.build(request, header)


async def _translate(body: TranslateBody, context: RequestContext) -> dict[str, Any]:
    """LibreTranslate's answer: one text or a list, with detections when the source is
    ``auto`` and alternatives when asked for."""
    q = body.q
    texts = [q] if isinstance(q, str) else q
    source = body.source
    await context.charge(sum(len(text) for text in texts))
    translator = context.translator
    if body.format == "html":
        outcomes = await translator.translate_markup(
            texts, body.target, source, deadline=context.deadline, inline=INLINE
        )
    else:
        outcomes = await translator.translate_batch(
            texts, body.target, source, deadline=context.deadline, alternatives=body.alternatives
        )
    done = every_translation(outcomes)
    if source == "auto":
        done = await _with_detections(translator, texts, done)
    answer: dict[str, Any] = {}
    if isinstance(q, str):
        answer["translatedText"] = done[0].text
        if source == "auto":
            answer["detectedLanguage"] = _detected(done[0])
        if body.alternatives:
            answer["alternatives"] = list(done[0].alternatives)
    else:
        answer["translatedText"] = [t.text for t in done]
        if source == "auto":
            answer["detectedLanguage"] = [_detected(t) for t in done]
        if body.alternatives:
            answer["alternatives"] = [list(t.alternatives) for t in done]
    return answer


def _frontend_settings(runtime: Runtime, access: AccessControl) -> dict[str, object]:
    """What LibreTranslate's own web page asks the server for."""
    return {
        "charLimit": runtime.max_text_chars,
        "frontendTimeout": 500,
        "apiKeys": access.requires_keys,
        "keyRequired": access.requires_keys,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [f".{name}" for name in EXTENSIONS],
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "en", "name": "English"},
        },
    }


async def _with_detections(
    translator: Translator, texts: list[str], done: list[Translation]
) -> list[Translation]:
    """Each translation with the language its text was detected in: a text the model never
    saw (numbers, a URL) was not detected on the way, so the detector says what it makes of it
    (with its own, low, confidence) rather than an answer made up here."""
    missing = [i for i, t in enumerate(done) if t.source is None or t.detected_confidence is None]
    if not missing:
        return done
    detections = await translator.detect([texts[i] for i in missing])
    found = list(done)
    for index, detection in zip(missing, detections, strict=True):
        found[index] = dataclasses.replace(
            done[index], source=detection.language, detected_confidence=detection.confidence
        )
    return found


def _detected(translation: Translation) -> dict[str, object]:
    assert translation.source is not None
    assert translation.detected_confidence is not None
    return {
        "confidence": round(translation.detected_confidence * 100, 1),
        "language": translation.source.code,
    }
