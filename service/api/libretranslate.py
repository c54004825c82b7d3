"""LibreTranslate-compatible API, mounted under ``/libretranslate``.

Answers LibreTranslate's request and response shapes exactly (``{"translatedText": ...}``,
``detectedLanguage`` with a percentage confidence, ``{"error": "..."}`` with its status codes) on
top of the same Translator, cache and scheduler as the native API. Unlike LibreTranslate, a list
of texts with ``source=auto`` is detected text by text.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.access import AccessControl, Client
from service.api.errors import install_dialect_errors
from service.api.params import Params, optional_text, read_params, text_list
from service.errors import Forbidden, InvalidInput, ServiceError, Unauthenticated
from service.runtime import Runtime
from service.translation.translator import Translation

# LibreTranslate's own status codes where they differ from the native API's.
_STATUS = {InvalidInput: 400, Unauthenticated: 403, Forbidden: 403}


def create_libretranslate_app(runtime: Runtime, access: AccessControl) -> FastAPI:
    app = FastAPI(title="LibreTranslate-compatible API", docs_url=None, redoc_url=None)

    install_dialect_errors(app, _STATUS, lambda error: {"error": error.message})

    def client_of(request: Request, params: Params) -> Client:
        key = optional_text(params, "api_key")
        header = request.headers.get("authorization") or (f"Bearer {key}" if key else None)
        address = request.client.host if request.client else "unknown"
        client = access.authenticate(header, address)
        access.admit(client)
        return client

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await read_params(request)
        client = client_of(request, params)
        q = params.get("q")
        texts = text_list(q, "q")
        target = optional_text(params, "target")
        if target is None:
            raise InvalidInput("invalid request: missing target parameter")
        source = optional_text(params, "source") or "auto"
        text_format = optional_text(params, "format") or "text"
        if text_format not in ("text", "html"):
            raise InvalidInput(f"invalid request: format must be text or html, not {text_format}")
        alternatives = int(params.get("alternatives") or 0)
        access.charge(client, sum(len(text) for text in texts))
        translator = runtime.translator
        if text_format == "html":
            outcomes = await translator.translate_markup(texts, target, source)
        else:
            outcomes = await translator.translate_batch(texts, target, source)
        done: list[Translation] = []
        for outcome in outcomes:
            if isinstance(outcome, ServiceError):
                raise outcome
            done.append(outcome)
        body: dict[str, Any] = {}
        if isinstance(q, str):
            body["translatedText"] = done[0].text
            if source == "auto":
                body["detectedLanguage"] = _detected(done[0])
            if alternatives:
                body["alternatives"] = []
        else:
            body["translatedText"] = [t.text for t in done]
            if source == "auto":
                body["detectedLanguage"] = [_detected(t) for t in done]
            if alternatives:
                body["alternatives"] = [[] for _ in done]
        return JSONResponse(body)

    @app.post("/detect")
    async def detect(request: Request) -> JSONResponse:
        params = await read_params(request)
        client = client_of(request, params)
        text = optional_text(params, "q")
        if text is None:
            raise InvalidInput("invalid request: missing q parameter")
        access.charge(client, len(text))
        (detection,) = runtime.translator.detect([text])
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

    @app.get("/frontend/settings")
    async def frontend_settings() -> JSONResponse:
        return JSONResponse(
            {
                "charLimit": runtime.settings.max_text_chars,
                "frontendTimeout": 500,
                "apiKeys": access.requires_keys,
                "keyRequired": access.requires_keys,
                "suggestions": False,
                "filesTranslation": False,
                "supportedFilesFormat": [],
                "language": {
                    "source": {"code": "auto", "name": "Auto Detect"},
                    "target": {"code": "en", "name": "English"},
                },
            }
        )

    return app


def _detected(translation: Translation) -> dict[str, object]:
    confidence = translation.detected_confidence
    return {
        "confidence": round((confidence if confidence is not None else 1.0) * 100, 1),
        "language": translation.source.code if translation.source else "auto",
    }
