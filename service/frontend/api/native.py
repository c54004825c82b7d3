"""The native translation API: ``/translate``, ``/batch_translate``, ``/languages``.

HTTP only: schemas in, schemas out, timing headers. Everything else is the translator's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from service.contract.errors import BatchTooLarge, ServiceError
from service.frontend.api.context import RequestContext
from service.frontend.api.dependencies import ContextDep, RuntimeDep
from service.frontend.api.glossaries import glossary_entries
from service.frontend.api.schemas import (
    BatchTranslateRequest,
    BatchTranslateResponse,
    DetectionOut,
    DetectRequest,
    ErrorDetail,
    ErrorResponse,
    LanguageOut,
    PromptOut,
    TranslateRequest,
    TranslationOut,
    Usage,
)
from service.frontend.glossaries import GlossaryStore
from service.frontend.translation.prompts import TranslationOptions
from service.frontend.translation.results import Translation

_ERRORS: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (401, "API key missing (keys are configured)"),
        (403, "API key not valid"),
        (413, "Request body too large"),
        (422, "Invalid input: empty text, unknown language, text or batch over its limit"),
        (429, "Queue full, or this client's rate or character quota spent; see Retry-After"),
        (503, "Model loading or engine unavailable"),
        (504, "The request's deadline (X-Request-Timeout or the server's) passed"),
    )
}

router = APIRouter(tags=["translation"])


async def _options(
    body: TranslateRequest | BatchTranslateRequest, context: RequestContext, request: Request
) -> TranslationOptions:
    """The body's options, with the terms of its stored glossary first."""
    options = body.options()
    if body.glossary_id is None:
        return options
    target, source = context.translator.languages_of(body.target_lang, body.source_lang)
    store: GlossaryStore = request.app.state.glossaries
    terms = await glossary_entries(store, context, body.glossary_id, source, target)
    return dataclasses.replace(options, glossary=terms + options.glossary)


def _timing_headers(response: Response, translations: Sequence[Translation]) -> None:
    """The article's diagnosis built in: time waiting for the GPU vs time on it."""
    queue_ms = max(t.queue_s for t in translations) * 1000
    inference_ms = max(t.inference_s for t in translations) * 1000
    response.headers["X-Queue-Time-Ms"] = f"{queue_ms:.1f}"
    response.headers["X-Inference-Time-Ms"] = f"{inference_ms:.1f}"


@router.post("/translate", response_model=TranslationOut, responses=_ERRORS)
async def translate(
    body: TranslateRequest,
    request: Request,
    response: Response,
    context: ContextDep,
) -> TranslationOut:
    """Translate one text."""
    options = await _options(body, context, request)
    await context.charge(len(body.text))
    translation = await context.translator.translate(
        body.text,
        body.target_lang,
        body.source_lang,
        deadline=context.deadline,
        options=options,
    )
    _timing_headers(response, [translation])
    response.headers["X-Cache"] = translation.cache
    return TranslationOut.of(translation)


@router.post(
    "/translate/stream",
    response_class=StreamingResponse,
    responses={
        **_ERRORS,
        200: {
            "content": {"text/event-stream": {}},
            "description": 'Server-sent events: `piece` ({"text"}) as the text is generated, '
            "then `done` (the POST /translate answer, with `timing`: `queue_ms`, "
            '`inference_ms`) or `error` ({"error": {code, message}}).',
        },
    },
)
async def translate_stream(
    body: TranslateRequest, request: Request, context: ContextDep
) -> StreamingResponse:
    """Translate one text and stream it: the body of ``POST /translate``; the pieces of the
    translation as the engine generates them, then the whole answer. Refusals and bad input
    before the stream starts are ordinary JSON errors; leaving early cancels the generation."""
    options = await _options(body, context, request)
    await context.charge(len(body.text))
    items = context.translator.stream_translation(
        body.text, body.target_lang, body.source_lang, deadline=context.deadline, options=options
    )
    first = await anext(items)  # admission and preparation happen before the answer starts

    async def events() -> AsyncIterator[bytes]:
        item: str | Translation | None = first
        try:
            while isinstance(item, str):
                if item:
                    yield _event("piece", {"text": item})
                item = await anext(items, None)
        except ServiceError as error:
            yield _event("error", {"error": {"code": error.code, "message": error.message}})
            return
        if isinstance(item, Translation):
            done = TranslationOut.of(item).model_dump()
            done["timing"] = {
                "queue_ms": round(item.queue_s * 1000, 1),
                "inference_ms": round(item.inference_s * 1000, 1),
            }
            yield _event("done", done)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        # Nginx buffers proxied answers unless told not to: each event must leave at once.
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
    )


def _event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


@router.post("/prompt", response_model=PromptOut, responses=_ERRORS)
async def prompt(body: TranslateRequest, request: Request, context: ContextDep) -> PromptOut:
    """What the model would read for this ``POST /translate`` body, without generating: the
    exact text (chat format included) and its token count. Nothing is queued or charged."""
    text, tokens = await context.translator.prompt(
        body.text,
        body.target_lang,
        body.source_lang,
        options=await _options(body, context, request),
    )
    return PromptOut(prompt=text, input_tokens=tokens)


@router.get(
    "/translate",
    response_model=TranslationOut,
    responses={**_ERRORS, 304: {"description": "Not modified (If-None-Match matched the ETag)"}},
)
async def translate_get(
    text: Annotated[str, Query(min_length=1, description="Text to translate.")],
    target_lang: Annotated[str, Query(description="Target language code.")],
    runtime: RuntimeDep,
    context: ContextDep,
    source_lang: Annotated[str | None, Query(description="Source language code.")] = None,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Translate one text given in the query string: same as the POST, but cacheable.

    The answer carries ``Cache-Control`` (for the result cache's TTL) and a strong ``ETag``, so
    a proxy or browser cache can serve repeats without reaching the GPU: ``public`` on an open
    service, ``private`` when keys are required (a shared cache must not hand one key's answers
    to a caller without it).
    """
    await context.charge(len(text))
    translation = await context.translator.translate(
        text, target_lang, source_lang, deadline=context.deadline
    )
    body = TranslationOut.of(translation).model_dump_json().encode()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    scope = "private" if context.access.requires_keys else "public"
    headers = {
        "Cache-Control": f"{scope}, max-age={int(runtime.cache_ttl_s)}",
        "ETag": etag,
        "X-Cache": translation.cache,
    }
    if if_none_match is not None and etag in (tag.strip() for tag in if_none_match.split(",")):
        return Response(status_code=304, headers=headers)
    response = Response(body, media_type="application/json", headers=headers)
    _timing_headers(response, [translation])
    return response


@router.post("/batch_translate", response_model=BatchTranslateResponse, responses=_ERRORS)
async def batch_translate(
    body: BatchTranslateRequest,
    request: Request,
    response: Response,
    context: ContextDep,
) -> BatchTranslateResponse:
    """Translate many texts into one language; results keep the input order.

    A text that fails alone (out of memory, deadline) gets an error object in its place while the
    others succeed; when every text failed, the request fails with the first text's error.
    """
    options = await _options(body, context, request)
    await context.charge(sum(len(text) for text in body.texts))
    outcomes = await context.translator.translate_batch(
        body.texts,
        body.target_lang,
        body.source_lang,
        deadline=context.deadline,
        options=options,
    )
    done = [outcome for outcome in outcomes if isinstance(outcome, Translation)]
    if not done:
        first = outcomes[0]
        assert isinstance(first, ServiceError)
        raise first
    _timing_headers(response, done)
    return BatchTranslateResponse(
        translations=[
            TranslationOut.of(outcome)
            if isinstance(outcome, Translation)
            else ErrorResponse(error=ErrorDetail(code=outcome.code, message=outcome.message))
            for outcome in outcomes
        ],
        usage=Usage(
            input_tokens=sum(t.input_tokens for t in done),
            output_tokens=sum(t.output_tokens for t in done),
        ),
    )


@router.post("/detect", response_model=list[DetectionOut], responses=_ERRORS)
async def detect(body: DetectRequest, context: ContextDep) -> list[DetectionOut]:
    """The language of each text, among the supported ones, with a confidence from 0 to 1."""
    translator = context.translator
    if len(body.texts) > translator.max_batch_items:
        raise BatchTooLarge(f"texts: at most {translator.max_batch_items} per request")
    await context.charge(sum(len(text) for text in body.texts))
    return [
        DetectionOut(language=d.language.code, confidence=d.confidence, uncertain=d.uncertain)
        for d in await translator.detect(body.texts)
    ]


@router.get("/languages", response_model=list[LanguageOut])
async def languages(context: ContextDep) -> list[LanguageOut]:
    """The supported languages and their codes."""
    return [
        LanguageOut(code=lang.code, name=lang.english_name, chinese_name=lang.chinese_name)
        for lang in context.translator.languages.values()
    ]
