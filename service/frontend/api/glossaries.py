"""Glossaries over HTTP: DeepL's routes (``/v2/glossaries`` for glossaries of one language pair,
``/v3/glossaries`` for multilingual ones: create, list, get, edit, replace or delete a dictionary,
entries, delete; ``/v2/glossary-language-pairs``), and the lookup of a ``glossary_id`` that the
DeepL and native translate routes share.

Both versions read and write the same store: a v2 glossary is a v3 glossary with one dictionary,
and the v2 routes show only those (a glossary of several dictionaries is a v3 one). Glossaries
belong to the key that created them (``frontend.glossaries``). The pairs offered are every pair of
the model's languages when the loaded family has a terminology template, none otherwise (a
glossary can then be stored but not used: translating with it is refused).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from service.contract.errors import InvalidInput, NotFound
from service.frontend.api.context import RequestContext
from service.frontend.api.deepl_requests import (
    DictionaryParams,
    GlossaryParams,
    MultilingualParams,
    PairParams,
    parse_deepl,
)
from service.frontend.api.openapi_body import json_body
from service.frontend.api.params import Params, read_params
from service.frontend.glossaries import (
    Dictionary,
    Entries,
    Glossary,
    GlossaryStore,
    parse_entries,
    to_tsv,
)
from service.frontend.translation.languages import Language

ContextOf = Callable[[Request, Params], Awaitable[RequestContext]]
# (the code given or None, the parameter's name) -> the language it names, or None when absent.
LanguageOf = Callable[[str | None, str], Language | None]


def glossary_code(language: Language) -> str:
    """DeepL's glossary language code: the base language, lower case."""
    return "zh" if language.code == "zh-Hant" else language.code.lower()


def _created(glossary: Glossary) -> str:
    created = datetime.datetime.fromtimestamp(glossary.created, datetime.UTC)
    return created.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def glossary_json(glossary: Glossary) -> dict[str, object]:
    """A single-dictionary glossary as ``/v2/glossaries`` shows it."""
    (dictionary,) = glossary.dictionaries
    return {
        "glossary_id": glossary.id,
        "name": glossary.name,
        "ready": True,
        "source_lang": dictionary.source_lang,
        "target_lang": dictionary.target_lang,
        "creation_time": _created(glossary),
        "entry_count": dictionary.entry_count,
    }


def _dictionary_json(dictionary: Dictionary) -> dict[str, object]:
    return {
        "source_lang": dictionary.source_lang,
        "target_lang": dictionary.target_lang,
        "entry_count": dictionary.entry_count,
    }


def multilingual_json(glossary: Glossary) -> dict[str, object]:
    """A glossary as ``/v3/glossaries`` shows it."""
    return {
        "glossary_id": glossary.id,
        "name": glossary.name,
        "dictionaries": [_dictionary_json(d) for d in glossary.dictionaries],
        "creation_time": _created(glossary),
    }


def _single(glossary: Glossary) -> Glossary:
    """``glossary``, where the v2 routes can show it (one dictionary)."""
    if len(glossary.dictionaries) != 1:
        raise InvalidInput("This glossary has several dictionaries: use /v3/glossaries for it.")
    return glossary


class _Pairs:
    """DeepL language codes to the store's pair codes, through the dialect's language lookup."""

    def __init__(self, language_of: LanguageOf) -> None:
        self._language_of = language_of

    def pair(self, source: str | None, target: str | None) -> tuple[str, str]:
        found = self._language_of(source, "source_lang"), self._language_of(target, "target_lang")
        if found[0] is None or found[1] is None:
            raise InvalidInput("Parameters 'source_lang' and 'target_lang' must be specified.")
        return glossary_code(found[0]), glossary_code(found[1])

    def dictionary(self, given: DictionaryParams) -> tuple[str, str, Entries]:
        source, target = self.pair(given.source_lang, given.target_lang)
        if given.entries is None:
            raise InvalidInput("Parameter 'entries' not specified.")
        return source, target, parse_entries(given.entries, (given.entries_format or "tsv").lower())


def install_glossary_routes(
    app: FastAPI, store: GlossaryStore, context_of: ContextOf, language_of: LanguageOf
) -> None:
    """``/glossaries`` (v2) and ``/glossary-language-pairs`` on the DeepL v2 app."""
    pairs = _Pairs(language_of)

    async def language_pairs(request: Request) -> JSONResponse:
        context = await context_of(request, await read_params(request))
        translator = context.translator
        if "glossary" not in translator.options:
            return JSONResponse({"supported_languages": []})
        codes = sorted({glossary_code(language) for language in translator.languages.values()})
        pairs = [{"source_lang": s, "target_lang": t} for s in codes for t in codes if s != t]
        return JSONResponse({"supported_languages": pairs})

    async def create(request: Request) -> JSONResponse:
        params = await read_params(request)
        context = await context_of(request, params)
        wanted = parse_deepl(GlossaryParams, params)
        if wanted.name is None:
            raise InvalidInput("Parameter 'name' not specified.")
        dictionary = pairs.dictionary(
            DictionaryParams(
                source_lang=wanted.source_lang,
                target_lang=wanted.target_lang,
                entries=wanted.entries,
                entries_format=wanted.entries_format,
            )
        )
        glossary = await asyncio.to_thread(
            store.create, context.owner, wanted.name, [dictionary], context.caller
        )
        return JSONResponse(glossary_json(glossary), status_code=201)

    async def listed(request: Request) -> JSONResponse:
        context = await context_of(request, await read_params(request))
        glossaries = await asyncio.to_thread(store.owned, context.owner)
        shown = [glossary_json(g) for g in glossaries if len(g.dictionaries) == 1]
        return JSONResponse({"glossaries": shown})

    async def info(request: Request, glossary_id: str) -> JSONResponse:
        context = await context_of(request, await read_params(request))
        glossary = await asyncio.to_thread(store.get, context.owner, glossary_id)
        return JSONResponse(glossary_json(_single(glossary)))

    async def delete(request: Request, glossary_id: str) -> Response:
        context = await context_of(request, await read_params(request))
        await asyncio.to_thread(store.delete, context.owner, glossary_id, context.caller)
        return Response(status_code=204)

    async def entries(request: Request, glossary_id: str) -> PlainTextResponse:
        context = await context_of(request, await read_params(request))
        glossary = _single(await asyncio.to_thread(store.get, context.owner, glossary_id))
        (only,) = glossary.dictionaries
        _, terms = await asyncio.to_thread(
            store.entries, context.owner, glossary_id, only.source_lang, only.target_lang
        )
        return PlainTextResponse(to_tsv(terms), media_type="text/tab-separated-values")

    app.add_api_route("/glossary-language-pairs", language_pairs, methods=["GET"])
    app.add_api_route("/glossaries", create, methods=["POST"])
    app.add_api_route("/glossaries", listed, methods=["GET"])
    app.add_api_route("/glossaries/{glossary_id}", info, methods=["GET"])
    app.add_api_route("/glossaries/{glossary_id}", delete, methods=["DELETE"])
    app.add_api_route("/glossaries/{glossary_id}/entries", entries, methods=["GET"])


def install_multilingual_routes(
    app: FastAPI, store: GlossaryStore, context_of: ContextOf, language_of: LanguageOf
) -> None:
    """``/glossaries`` of DeepL's v3 API, on an app mounted at ``/v3``."""
    routes = _MultilingualRoutes(store, context_of, _Pairs(language_of))
    glossary_body = json_body(MultilingualParams)
    app.add_api_route("/glossaries", routes.create, methods=["POST"], openapi_extra=glossary_body)
    app.add_api_route("/glossaries", routes.listed, methods=["GET"])
    app.add_api_route("/glossaries/{glossary_id}", routes.info, methods=["GET"])
    app.add_api_route(
        "/glossaries/{glossary_id}", routes.edit, methods=["PATCH"], openapi_extra=glossary_body
    )
    app.add_api_route("/glossaries/{glossary_id}", routes.delete, methods=["DELETE"])
    app.add_api_route("/glossaries/{glossary_id}/entries", routes.entries, methods=["GET"])
    dictionaries = "/glossaries/{glossary_id}/dictionaries"
    app.add_api_route(
        dictionaries, routes.replace, methods=["PUT"], openapi_extra=json_body(DictionaryParams)
    )
    app.add_api_route(dictionaries, routes.delete_dictionary, methods=["DELETE"])


class _MultilingualRoutes:
    """The handlers of DeepL's ``/v3/glossaries`` routes."""

    def __init__(self, store: GlossaryStore, context_of: ContextOf, pairs: _Pairs) -> None:
        self._store = store
        self._context_of = context_of
        self._pairs = pairs

    async def _read(self, request: Request) -> tuple[Params, RequestContext]:
        params = await read_params(request)
        return params, await self._context_of(request, params)

    async def create(self, request: Request) -> JSONResponse:
        params, context = await self._read(request)
        wanted = parse_deepl(MultilingualParams, params)
        if wanted.name is None:
            raise InvalidInput("Parameter 'name' not specified.")
        if not wanted.dictionaries:
            raise InvalidInput("Parameter 'dictionaries' not specified.")
        dictionaries = [self._pairs.dictionary(given) for given in wanted.dictionaries]
        glossary = await asyncio.to_thread(
            self._store.create, context.owner, wanted.name, dictionaries, context.caller
        )
        return JSONResponse(multilingual_json(glossary), status_code=201)

    async def listed(self, request: Request) -> JSONResponse:
        _, context = await self._read(request)
        glossaries = await asyncio.to_thread(self._store.owned, context.owner)
        return JSONResponse({"glossaries": [multilingual_json(g) for g in glossaries]})

    async def info(self, request: Request, glossary_id: str) -> JSONResponse:
        _, context = await self._read(request)
        glossary = await asyncio.to_thread(self._store.get, context.owner, glossary_id)
        return JSONResponse(multilingual_json(glossary))

    async def edit(self, request: Request, glossary_id: str) -> JSONResponse:
        params, context = await self._read(request)
        wanted = parse_deepl(MultilingualParams, params)
        if wanted.name is None and not wanted.dictionaries:
            raise InvalidInput("Parameter 'name' or 'dictionaries' must be specified.")
        dictionaries = [self._pairs.dictionary(given) for given in wanted.dictionaries or []]
        glossary = await asyncio.to_thread(
            self._store.update,
            context.owner,
            glossary_id,
            wanted.name,
            dictionaries,
            context.caller,
        )
        return JSONResponse(multilingual_json(glossary))

    async def replace(self, request: Request, glossary_id: str) -> JSONResponse:
        params, context = await self._read(request)
        source, target, terms = self._pairs.dictionary(parse_deepl(DictionaryParams, params))
        dictionary = await asyncio.to_thread(
            self._store.replace, context.owner, glossary_id, source, target, terms, context.caller
        )
        return JSONResponse(_dictionary_json(dictionary))

    async def entries(self, request: Request, glossary_id: str) -> JSONResponse:
        params, context = await self._read(request)
        wanted = parse_deepl(PairParams, params)
        source, target = self._pairs.pair(wanted.source_lang, wanted.target_lang)
        glossary, terms = await asyncio.to_thread(
            self._store.entries, context.owner, glossary_id, source, target
        )
        if glossary.dictionary(source, target) is None:
            raise NotFound("Dictionary not found")
        dictionary = {
            "source_lang": source,
            "target_lang": target,
            "entries": to_tsv(terms),
            "entries_format": "tsv",
        }
        return JSONResponse({"dictionaries": [dictionary]})

    async def delete_dictionary(self, request: Request, glossary_id: str) -> Response:
        params, context = await self._read(request)
        wanted = parse_deepl(PairParams, params)
        source, target = self._pairs.pair(wanted.source_lang, wanted.target_lang)
        await asyncio.to_thread(
            self._store.delete_dictionary,
            context.owner,
            glossary_id,
            source,
            target,
            context.caller,
        )
        return Response(status_code=204)

    async def delete(self, request: Request, glossary_id: str) -> Response:
        _, context = await self._read(request)
        await asyncio.to_thread(self._store.delete, context.owner, glossary_id, context.caller)
        return Response(status_code=204)


async def glossary_entries(
    store: GlossaryStore,
    context: RequestContext,
    glossary_id: str,
    source: Language | None,
    target: Language,
) -> tuple[tuple[str, str], ...]:
    """The entries of the caller's glossary ``glossary_id`` for translating ``source`` into
    ``target``: its dictionary of that pair (DeepL's rules: the source language must be given,
    and the glossary must have the pair)."""
    if source is None:
        raise InvalidInput(
            "Use of a glossary requires the 'source_lang' parameter to be specified."
        )
    pair = glossary_code(source), glossary_code(target)
    glossary, terms = await asyncio.to_thread(store.entries, context.owner, glossary_id, *pair)
    if glossary.dictionary(*pair) is None:
        raise InvalidInput("Glossary does not match the given language pair.")
    return tuple(terms)
