"""Glossaries over HTTP: DeepL's routes on the DeepL app (``/v2/glossaries``: create from TSV
or CSV entries, list, get, entries, delete; ``/v2/glossary-language-pairs``), and the lookup of a
``glossary_id`` that the DeepL and native translate routes share.

Glossaries belong to the key that created them (``frontend.glossaries``). The pairs offered are
every pair of the model's languages when the loaded family has a terminology template, none
otherwise (a glossary can then be stored but not used: translating with it is refused).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from service.contract.errors import InvalidInput
from service.frontend.api.context import RequestContext
from service.frontend.api.deepl_requests import GlossaryParams, parse_deepl
from service.frontend.api.params import Params, read_params
from service.frontend.glossaries import Glossary, GlossaryStore, parse_entries, to_tsv
from service.frontend.translation.languages import Language

ContextOf = Callable[[Request, Params], RequestContext]
# (the code given or None, the parameter's name) -> the language it names, or None when absent.
LanguageOf = Callable[[str | None, str], Language | None]


def glossary_code(language: Language) -> str:
    """DeepL's glossary language code: the base language, lower case."""
    return "zh" if language.code == "zh-Hant" else language.code.lower()


def glossary_json(glossary: Glossary) -> dict[str, object]:
    created = datetime.datetime.fromtimestamp(glossary.created, datetime.UTC)
    return {
        "glossary_id": glossary.id,
        "name": glossary.name,
        "ready": True,
        "source_lang": glossary.source_lang,
        "target_lang": glossary.target_lang,
        "creation_time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "entry_count": glossary.entry_count,
    }


def install_glossary_routes(
    app: FastAPI,
    store: GlossaryStore,
    context_of: ContextOf,
    language_of: LanguageOf,
) -> None:
    async def language_pairs(request: Request) -> JSONResponse:
        context = context_of(request, await read_params(request))
        translator = context.translator
        if "glossary" not in translator.options:
            return JSONResponse({"supported_languages": []})
        codes = sorted({glossary_code(language) for language in translator.languages.values()})
        pairs = [{"source_lang": s, "target_lang": t} for s in codes for t in codes if s != t]
        return JSONResponse({"supported_languages": pairs})

    app.add_api_route("/glossary-language-pairs", language_pairs, methods=["GET"])

    async def create(request: Request) -> JSONResponse:
        params = await read_params(request)
        context = context_of(request, params)
        wanted = parse_deepl(GlossaryParams, params)
        if wanted.name is None:
            raise InvalidInput("Parameter 'name' not specified.")
        source = language_of(wanted.source_lang, "source_lang")
        target = language_of(wanted.target_lang, "target_lang")
        if source is None or target is None:
            raise InvalidInput("Parameters 'source_lang' and 'target_lang' must be specified.")
        if wanted.entries is None:
            raise InvalidInput("Parameter 'entries' not specified.")
        entries = parse_entries(wanted.entries, (wanted.entries_format or "tsv").lower())
        glossary = await asyncio.to_thread(
            store.create,
            context.owner,
            wanted.name,
            glossary_code(source),
            glossary_code(target),
            entries,
        )
        return JSONResponse(glossary_json(glossary), status_code=201)

    async def listed(request: Request) -> JSONResponse:
        context = context_of(request, await read_params(request))
        glossaries = await asyncio.to_thread(store.owned, context.owner)
        return JSONResponse({"glossaries": [glossary_json(g) for g in glossaries]})

    app.add_api_route("/glossaries", create, methods=["POST"])
    app.add_api_route("/glossaries", listed, methods=["GET"])

    async def info(request: Request, glossary_id: str) -> JSONResponse:
        context = context_of(request, await read_params(request))
        glossary = await asyncio.to_thread(store.get, context.owner, glossary_id)
        return JSONResponse(glossary_json(glossary))

    async def delete(request: Request, glossary_id: str) -> Response:
        context = context_of(request, await read_params(request))
        await asyncio.to_thread(store.delete, context.owner, glossary_id)
        return Response(status_code=204)

    async def entries(request: Request, glossary_id: str) -> PlainTextResponse:
        context = context_of(request, await read_params(request))
        _, pairs = await asyncio.to_thread(store.lookup, context.owner, glossary_id)
        return PlainTextResponse(to_tsv(pairs), media_type="text/tab-separated-values")

    app.add_api_route("/glossaries/{glossary_id}", info, methods=["GET"])
    app.add_api_route("/glossaries/{glossary_id}", delete, methods=["DELETE"])
    app.add_api_route("/glossaries/{glossary_id}/entries", entries, methods=["GET"])


async def glossary_entries(
    store: GlossaryStore,
    context: RequestContext,
    glossary_id: str,
    source: Language | None,
    target: Language,
) -> tuple[tuple[str, str], ...]:
    """The entries of the caller's glossary ``glossary_id`` for translating ``source`` into
    ``target`` (DeepL's rules: the source language must be given and the pair must match)."""
    if source is None:
        raise InvalidInput(
            "Use of a glossary requires the 'source_lang' parameter to be specified."
        )
    glossary, pairs = await asyncio.to_thread(store.lookup, context.owner, glossary_id)
    if (glossary.source_lang, glossary.target_lang) != (
        glossary_code(source),
        glossary_code(target),
    ):
        raise InvalidInput("Glossary does not match the given language pair.")
    return tuple(pairs)
