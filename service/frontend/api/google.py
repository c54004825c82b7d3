"""Google Cloud Translation's REST APIs, for the clients and integrations that speak them.

Basic (v2), mounted under ``/language/translate``: ``POST``/``GET /language/translate/v2`` (``q``
repeated or a list, ``target``, ``source``, ``format`` text or html, ``model``), ``/v2/detect``,
``/v2/languages`` (``target`` for names in that language). Advanced (v3), mounted under
``/v3/projects``: ``{parent}:translateText`` (``contents``, ``mimeType``, ``sourceLanguageCode``,
``targetLanguageCode``, ``model``, ``glossaryConfig`` naming a stored glossary),
``{parent}:detectLanguage`` and ``{parent}/supportedLanguages``, where ``parent`` is
``projects/P`` or ``projects/P/locations/L`` (the project and location are not checked: there is
one service). The key comes as ``key`` in the query, ``X-Goog-Api-Key`` or ``Authorization:
Bearer``, against the same key store as every other API; quotas and deadlines are the one request
pipeline's. Errors are Google's ``{"error": {"code", "message", "errors", "status"}}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.contract import errors
from service.contract.errors import BatchTooLarge, InvalidInput, ServiceError, Unsupported
from service.frontend.access import AccessControl
from service.frontend.api.context import RequestContext
from service.frontend.api.errors import Dialect, status_of
from service.frontend.api.glossaries import glossary_entries
from service.frontend.api.mounts import dialect_app
from service.frontend.api.openapi_body import json_body
from service.frontend.api.params import Params, parse, read_params
from service.frontend.glossaries import GlossaryStore
from service.frontend.runtime import Runtime
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.localized import language_name
from service.frontend.translation.markup import INLINE
from service.frontend.translation.prompts import TranslationOptions
from service.frontend.translation.results import Translation, every_translation

M = TypeVar("M", bound=BaseModel)

_STATUS: dict[type[errors.ServiceError], int] = {
    errors.InvalidInput: 400,
    errors.Unsupported: 400,
    errors.Unauthenticated: 403,
    errors.Forbidden: 403,
    errors.QuotaExceeded: 429,
    errors.RateLimited: 429,
    errors.LimitReached: 429,
}
# Google's canonical status names by HTTP status.
_CANONICAL = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    507: "RESOURCE_EXHAUSTED",
}


def _body(error: ServiceError) -> dict[str, object]:
    status = status_of(error, _STATUS)
    canonical = _CANONICAL.get(status, "INTERNAL")
    reason = "invalid" if status == 400 else canonical.lower()
    return {
        "error": {
            "code": status,
            "message": error.message,
            "errors": [{"message": error.message, "domain": "global", "reason": reason}],
            "status": canonical,
        }
    }


GOOGLE = Dialect("/language/translate", _STATUS, _body)
GOOGLE_V3 = Dialect("/v3/projects", _STATUS, _body)
# Google's codes for the two written Chinese (its own spelling; the model's are zh and zh-Hant).
_GOOGLE_CODES = {"zh": "zh-CN", "zh-Hant": "zh-TW"}


def google_code(language: Language) -> str:
    return _GOOGLE_CODES.get(language.code, language.code)


# The most texts one request carries, as Google's own servers take them: v2's ``q`` (128,
# "Too many text segments" past it) and v3's ``contents`` (1,024). A client built for Google
# already splits its batches so; past them one request would hold many decode rows.
MOST_V2_SEGMENTS = 128
MOST_V3_CONTENTS = 1024


def _at_most(texts: list[str], most: int, field: str) -> None:
    if len(texts) > most:
        raise BatchTooLarge(f"Too many text segments: {len(texts)} in '{field}', at most {most}")


def _texts(value: object) -> list[str]:
    texts = value if isinstance(value, list) else [value] if value is not None else []
    if not texts or not all(isinstance(text, str) for text in texts):
        raise ValueError("q: one or more texts")
    return [text for text in texts if isinstance(text, str)]


Texts = Annotated[list[str], BeforeValidator(_texts)]


class _GoogleParams(BaseModel):
    # Google's clients send more than this service reads (labels, $alt, prettyPrint): ignored.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class TranslateV2(_GoogleParams):
    q: Texts
    target: str = Field(min_length=1)
    source: str | None = None
    # Google's own default is html (null too, as the v2 client sends an unset one).
    format: Literal["text", "html"] | None = None
    model: str | None = None
    cid: list[str] | str | None = None


class DetectV2(_GoogleParams):
    q: Texts


class LanguagesV2(_GoogleParams):
    target: str | None = None
    model: str | None = None


class GlossaryConfig(_GoogleParams):
    glossary: str = Field(min_length=1)
    ignore_case: bool = Field(False, alias="ignoreCase")


class TranslateV3(_GoogleParams):
    contents: list[str] = Field(min_length=1)
    target_language_code: str = Field(alias="targetLanguageCode", min_length=1)
    source_language_code: str | None = Field(None, alias="sourceLanguageCode")
    mime_type: Literal["text/plain", "text/html"] | None = Field(None, alias="mimeType")
    model: str | None = None
    glossary_config: GlossaryConfig | None = Field(None, alias="glossaryConfig")
    transliteration_config: dict[str, Any] | None = Field(None, alias="transliterationConfig")


class DetectV3(_GoogleParams):
    content: str = Field(min_length=1)
    mime_type: Literal["text/plain", "text/html"] | None = Field(None, alias="mimeType")


class LanguagesV3(_GoogleParams):
    display_language_code: str | None = Field(None, alias="displayLanguageCode")


def parse_google(model: type[M], params: Params) -> M:
    """``params`` as ``model``, or ``InvalidInput`` naming the field as Google's errors do."""
    return parse(
        model,
        params,
        missing="Required Text or field '{field}' is missing.",
        invalid="Invalid value at '{field}'.",
    )


async def google_context(request: Request) -> RequestContext:
    """The caller, from ``key`` in the query, ``X-Goog-Api-Key`` or ``Authorization``."""
    key = request.query_params.get("key") or request.headers.get("x-goog-api-key")
    header = f"Bearer {key}" if key else request.headers.get("authorization")
    try:
        return await RequestContext.build(request, header)
    except errors.Unauthenticated:
        raise errors.Unauthenticated(
            "The request is missing a valid API key: send it as ?key= or X-Goog-Api-Key."
        ) from None
    except errors.Forbidden:
        raise errors.Forbidden("API key not valid. Please pass a valid API key.") from None


def _language(table: LanguageTable, code: str | None, field: str) -> Language | None:
    if code is None or code == "":
        return None
    found = table.lookup(code)
    if found is None:
        raise InvalidInput(f"Invalid value for {field}: {code!r} is not a language of this model")
    return found


async def _translated(
    context: RequestContext,
    texts: list[str],
    target: Language,
    source: Language | None,
    html: bool,
    options: TranslationOptions,
) -> list[Translation]:
    """The texts translated through the one pipeline (admission, cache, deadline), charged."""
    translator = context.translator
    await context.charge(sum(len(text) for text in texts))
    source_code = source.code if source is not None else None
    if html:
        outcomes = await translator.translate_markup(
            texts, target.code, source_code, deadline=context.deadline, inline=INLINE
        )
    else:
        outcomes = await translator.translate_batch(
            texts, target.code, source_code, deadline=context.deadline, options=options
        )
    return every_translation(outcomes)


async def _detected(
    context: RequestContext, texts: list[str], done: list[Translation]
) -> list[Language]:
    """Each text's language: as the translation detected it, else the detector's guess."""
    missing = [i for i, translation in enumerate(done) if translation.source is None]
    guesses = await context.translator.detect([texts[i] for i in missing])
    found = dict(zip(missing, (guess.language for guess in guesses), strict=True))
    return [t.source if t.source is not None else found[i] for i, t in enumerate(done)]


def _pair(
    table: LanguageTable, target: str, source: str | None, fields: tuple[str, str]
) -> tuple[Language, Language | None]:
    """The target and the (optional) source language a request names."""
    found = _language(table, target, fields[0])
    assert found is not None  # the models require a target
    return found, _language(table, source, fields[1])


def _entries(
    done: list[Translation],
    detected: list[Language] | None,
    model: str | None,
    detected_key: str,
) -> list[dict[str, object]]:
    """Google's translations: the text, the detected language where none was given (under
    ``detected_key``, which v2 and v3 name differently), the model where one was asked for."""
    entries: list[dict[str, object]] = []
    for index, translation in enumerate(done):
        entry: dict[str, object] = {"translatedText": translation.text}
        if detected is not None:
            entry[detected_key] = google_code(detected[index])
        if model is not None:
            entry["model"] = model
        entries.append(entry)
    return entries


async def _translate_v2(request: Request) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(TranslateV2, params)
    _at_most(body.q, MOST_V2_SEGMENTS, "q")
    if body.cid:
        raise Unsupported("cid: custom models are not served")
    target, source = _pair(
        context.translator.languages, body.target, body.source, ("target", "source")
    )
    html = body.format != "text"
    done = await _translated(context, body.q, target, source, html, TranslationOptions())
    detected = await _detected(context, body.q, done) if source is None else None
    translations = _entries(done, detected, body.model, "detectedSourceLanguage")
    return JSONResponse({"data": {"translations": translations}})


async def _detect_v2(request: Request) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(DetectV2, params)
    _at_most(body.q, MOST_V2_SEGMENTS, "q")
    await context.charge(sum(len(text) for text in body.q))
    found = await context.translator.detect(body.q)
    detections = [
        [{"language": google_code(d.language), "isReliable": False, "confidence": d.confidence}]
        for d in found
    ]
    return JSONResponse({"data": {"detections": detections}})


def _languages(table: LanguageTable, display: str | None) -> list[tuple[Language, str | None]]:
    """Every language, with its name in the ``display`` language (None: no names asked)."""
    shown = table.lookup(display) if display else None
    if display and shown is None:
        raise InvalidInput(f"Invalid value for the display language: {display}")
    return [
        (language, language_name(language, shown) if shown else None) for language in table.values()
    ]


async def _languages_v2(request: Request) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(LanguagesV2, params)
    entries: list[dict[str, str]] = []
    for language, name in _languages(context.translator.languages, body.target):
        entry = {"language": google_code(language)}
        if name is not None:
            entry["name"] = name
        entries.append(entry)
    return JSONResponse({"data": {"languages": entries}})


def create_google_v2_app(runtime: Runtime, access: AccessControl) -> FastAPI:
    """Google Cloud Translation Basic (v2), mounted at ``/language/translate``."""
    app = dialect_app("Google Cloud Translation v2-compatible API", runtime, access, GOOGLE)
    app.add_api_route("/v2", _translate_v2, methods=["POST"], openapi_extra=json_body(TranslateV2))
    app.add_api_route("/v2/detect", _detect_v2, methods=["POST"], openapi_extra=json_body(DetectV2))
    app.add_api_route(
        "/v2/languages", _languages_v2, methods=["POST"], openapi_extra=json_body(LanguagesV2)
    )
    # The same with the parameters in the query (Google's v2 takes both).
    app.add_api_route("/v2", _translate_v2, methods=["GET"])
    app.add_api_route("/v2/detect", _detect_v2, methods=["GET"])
    app.add_api_route("/v2/languages", _languages_v2, methods=["GET"])
    return app


def _glossary_id(name: str) -> str:
    """The glossary id of ``projects/P/locations/L/glossaries/ID`` (or a bare id)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


async def _translate_v3(request: Request, glossaries: GlossaryStore) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(TranslateV3, params)
    _at_most(body.contents, MOST_V3_CONTENTS, "contents")
    if body.transliteration_config:
        raise Unsupported("transliterationConfig: transliteration is not served")
    target, source = _pair(
        context.translator.languages,
        body.target_language_code,
        body.source_language_code,
        ("targetLanguageCode", "sourceLanguageCode"),
    )
    html = body.mime_type != "text/plain"
    terms = None
    if body.glossary_config is not None:  # found (or refused) before any work is done
        glossary_id = _glossary_id(body.glossary_config.glossary)
        terms = await glossary_entries(glossaries, context, glossary_id, source, target)
    plain = await _translated(context, body.contents, target, source, html, TranslationOptions())
    detected = await _detected(context, body.contents, plain) if source is None else None
    answer: dict[str, object] = {
        "translations": _entries(plain, detected, body.model, "detectedLanguageCode")
    }
    if terms is not None:
        # Google answers both: the translations without the glossary and with it.
        options = TranslationOptions(glossary=terms)
        with_terms = await _translated(context, body.contents, target, source, html, options)
        answer["glossaryTranslations"] = _entries(
            with_terms, detected, body.model, "detectedLanguageCode"
        )
    return JSONResponse(answer)


async def _detect_v3(request: Request) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(DetectV3, params)
    await context.charge(len(body.content))
    (found,) = await context.translator.detect([body.content])
    language = {"languageCode": google_code(found.language), "confidence": found.confidence}
    return JSONResponse({"languages": [language]})


async def _languages_v3(request: Request) -> JSONResponse:
    params = await read_params(request)
    context = await google_context(request)
    body = parse_google(LanguagesV3, params)
    entries: list[dict[str, object]] = []
    for language, name in _languages(context.translator.languages, body.display_language_code):
        entry: dict[str, object] = {
            "languageCode": google_code(language),
            "supportSource": True,
            "supportTarget": True,
        }
        if name is not None:
            entry["displayName"] = name
        entries.append(entry)
    return JSONResponse({"languages": entries})


def create_google_v3_app(
    runtime: Runtime, access: AccessControl, glossaries: GlossaryStore
) -> FastAPI:
    """Google Cloud Translation Advanced (v3), mounted at ``/v3/projects``."""
    app = dialect_app("Google Cloud Translation v3-compatible API", runtime, access, GOOGLE_V3)

    async def translate(request: Request) -> JSONResponse:
        return await _translate_v3(request, glossaries)

    for parent in ("/{project}", "/{project}/locations/{location}"):
        app.add_api_route(
            f"{parent}:translateText",
            translate,
            methods=["POST"],
            openapi_extra=json_body(TranslateV3),
        )
        app.add_api_route(
            f"{parent}:detectLanguage",
            _detect_v3,
            methods=["POST"],
            openapi_extra=json_body(DetectV3),
        )
        app.add_api_route(f"{parent}/supportedLanguages", _languages_v3, methods=["GET"])
    return app
