"""DeepL API v2-compatible endpoints, mounted under ``/v2``.

``POST``/``GET /v2/translate`` (JSON, form or query; ``text`` repeated), ``GET``/``POST
/v2/languages``, ``GET``/``POST /v2/usage``, glossaries (``api.glossaries``) and documents
(``api.documents``). The key comes as ``Authorization: DeepL-Auth-Key KEY`` (or ``Bearer KEY``),
or as the legacy ``auth_key`` parameter, against the same key store as the native API. The
parameters are read into typed models (``api.deepl_requests``). Errors are ``{"message": ...}``
in DeepL's wording and statuses (400, 403, 404, 413 over 128 KiB, 429, 456 when a key's
character quota is spent). DeepL's language codes map onto the model's: targets
``EN-GB``/``EN-US``, ``PT-BR``/``PT-PT``, ``ZH``/``ZH-HANS``, ``ZH-HANT`` (the official clients
refuse the bare ``EN`` and ``PT`` as targets; they are still accepted). Options the model cannot
honour are refused with a 400 that names them; options that cannot change a one-model,
one-segment translation are validated as DeepL does and ignored (docs/dialects.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.contract.errors import (
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    LimitReached,
    PayloadTooLarge,
    QuotaExceeded,
    Unauthenticated,
    Unsupported,
)
from service.frontend.access import AccessControl
from service.frontend.api.context import RequestContext
from service.frontend.api.deepl_requests import (
    DeepLOptions,
    LanguagesParams,
    TranslateParams,
    parse_deepl,
    single,
)
from service.frontend.api.documents import install_deepl_document_routes
from service.frontend.api.errors import Dialect
from service.frontend.api.glossaries import (
    glossary_entries,
    install_glossary_routes,
    install_multilingual_routes,
)
from service.frontend.api.mounts import dialect_app
from service.frontend.api.params import Params, read_params
from service.frontend.documents.service import Documents
from service.frontend.glossaries import GlossaryStore
from service.frontend.runtime import Runtime
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.markup import INLINE
from service.frontend.translation.prompts import TranslationOptions
from service.frontend.translation.results import Translation, every_translation

MAX_REQUEST_BYTES = 128 * 1024
# Formality the model is told nothing about: ``default``, and the ``prefer_`` values, which DeepL
# defines as "if the target language supports it".
_SAFE_FORMALITY = ("default", "prefer_more", "prefer_less")
# Formality as a Hy-MT2 style (the families with a style template).
_STYLES = {"more": "formal", "prefer_more": "formal", "less": "informal", "prefer_less": "informal"}
# The one model there is, for ``model_type_used``.
_MODEL_TYPE = "quality_optimized"
_STATUS = {
    InvalidInput: 400,
    Unauthenticated: 403,
    Forbidden: 403,
    QuotaExceeded: 456,
    LimitReached: 456,  # DeepL's answer to one glossary too many
    DeadlineExceeded: 504,
}
DEEPL = Dialect("/v2", _STATUS, lambda error: {"message": error.message})
# DeepL's v3 API: its multilingual glossaries, in the same shape.
DEEPL_V3 = Dialect("/v3/glossaries", _STATUS, DEEPL.body)


@dataclass(frozen=True, slots=True)
class _Code:
    code: str
    name: str
    language: Language


def source_codes(table: LanguageTable) -> list[_Code]:
    """DeepL's source list: one code per language, without script or region (``ZH`` covers
    both scripts)."""
    return [
        _Code(language.code.upper(), language.english_name, language)
        for language in table.values()
        if language.code != "zh-Hant"
    ]


def target_codes(table: LanguageTable) -> list[_Code]:
    """DeepL's target list: English, Portuguese and Chinese by variant, as DeepL lists them."""
    variants = {
        "en": (("EN-GB", "English (British)"), ("EN-US", "English (American)")),
        "pt": (("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)")),
        "zh": (("ZH", "Chinese (simplified)"), ("ZH-HANS", "Chinese (simplified)")),
        "zh-Hant": (("ZH-HANT", "Chinese (traditional)"),),
    }
    codes: list[_Code] = []
    for language in table.values():
        for code, name in variants.get(
            language.code, ((language.code.upper(), language.english_name),)
        ):
            codes.append(_Code(code, name, language))
    return codes


def deepl_code(language: Language) -> str:
    """The code DeepL reports a detected source language by."""
    return "ZH" if language.code == "zh-Hant" else language.code.upper()


async def deepl_context(request: Request, params: Params) -> RequestContext:
    """The caller, from the ``Authorization`` header or the legacy ``auth_key`` parameter."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, key = header.partition(" ")
        if scheme.lower() not in ("deepl-auth-key", "bearer"):
            key = ""
    else:
        try:
            key = single(params.get("auth_key")) or ""
        except ValueError:
            key = ""
    try:
        return await RequestContext.build(request, f"Bearer {key.strip()}" if key else None)
    except Unauthenticated:
        raise Unauthenticated(
            "Authorization failure: send the key as Authorization: DeepL-Auth-Key <key>"
        ) from None
    except Forbidden:
        raise Forbidden("Authorization failure: the key is not valid") from None


def language_of(
    table: LanguageTable, given: str | None, name: str, codes: list[_Code]
) -> Language | None:
    """The language a DeepL code (or another spelling of it) names; ``None`` when not given."""
    if given is None:
        return None
    upper = given.upper()
    for entry in codes:
        if entry.code == upper:
            return entry.language
    found = table.lookup(given)  # EN, PT, other spellings
    if found is None:
        raise InvalidInput(f"Value for '{name}' not supported.")
    return found


async def translation_options(
    wanted: DeepLOptions,
    context: RequestContext,
    glossaries: GlossaryStore,
    source: Language | None,
    target: Language,
) -> TranslationOptions:
    """What ``formality``, ``glossary_id`` and ``context`` ask of the model family."""
    translator = context.translator
    formality = (wanted.formality or "default").lower()
    styled = "style" in translator.options and formality in _STYLES
    if formality not in _SAFE_FORMALITY and not styled:
        raise InvalidInput("'formality' is not supported for given 'target_lang'.")
    refused = wanted.refused()
    if refused:
        raise Unsupported(f"unsupported parameter(s): {', '.join(refused)}")
    instructions = tuple(wanted.custom_instructions)
    if instructions and "preferences" not in translator.options:
        # The family's templates have no slot for them (Hy-MT2's have: its preferences).
        raise InvalidInput("'custom_instructions' is not supported by this model.")
    terms = (
        await glossary_entries(glossaries, context, wanted.glossary_id, source, target)
        if wanted.glossary_id is not None
        else ()
    )
    hint = wanted.context
    return TranslationOptions(
        glossary=terms,
        # DeepL's context is a hint: it goes to the family's context template where there is
        # one, and is ignored (not billed) where there is none.
        context=hint if hint and "context" in translator.options else None,
        style=_STYLES[formality] if styled else None,
        preferences=instructions,
    )


async def _translate(
    params: TranslateParams, context: RequestContext, glossaries: GlossaryStore
) -> list[Translation]:
    """The texts translated as ``params`` ask (markup by its tags, plain texts by batch)."""
    translator = context.translator
    languages = translator.languages
    target = language_of(languages, params.target_lang, "target_lang", target_codes(languages))
    if target is None:
        raise InvalidInput("Parameter 'target_lang' not specified.")
    source = language_of(languages, params.source_lang, "source_lang", source_codes(languages))
    wanted = await translation_options(params, context, glossaries, source, target)
    await context.charge(sum(len(text) for text in params.text))
    source_code = source.code if source is not None else None
    if params.tag_handling or params.ignore_tags:
        # Inline elements do not split a sentence: HTML's formatting elements by default,
        # and the non_splitting_tags given, less the splitting_tags given.
        html = params.tag_handling is not None and params.tag_handling.lower() == "html"
        inline = (INLINE if html else frozenset()) | set(params.non_splitting_tags)
        outcomes = await translator.translate_markup(
            params.text,
            target.code,
            source_code,
            deadline=context.deadline,
            ignore=params.ignore_tags,
            inline=inline - set(params.splitting_tags),
        )
    else:
        outcomes = await translator.translate_batch(
            params.text, target.code, source_code, deadline=context.deadline, options=wanted
        )
    return every_translation(outcomes)


async def _answer(
    params: TranslateParams, context: RequestContext, outcomes: list[Translation]
) -> dict[str, object]:
    """DeepL's answer: each text's translation, detected language and billed characters."""
    texts = params.text
    # A text the model never saw (numbers, a URL) was not detected on the way: the detector
    # says what it makes of it, rather than a language made up here.
    undetected = [i for i, outcome in enumerate(outcomes) if outcome.source is None]
    found = await context.translator.detect([texts[i] for i in undetected])
    guesses = dict(zip(undetected, found, strict=True))
    languages = context.translator.languages
    given = language_of(languages, params.source_lang, "source_lang", source_codes(languages))
    translations: list[dict[str, object]] = []
    for index, (text, outcome) in enumerate(zip(texts, outcomes, strict=True)):
        guess = guesses.get(index)
        detected = outcome.source or (guess.language if guess else given)
        assert detected is not None
        entry: dict[str, object] = {
            "detected_source_language": deepl_code(detected),
            "text": outcome.text,
            "billed_characters": len(text),
        }
        if params.model_type is not None:
            entry["model_type_used"] = _MODEL_TYPE
        translations.append(entry)
    return {"translations": translations}


def _languages(params: LanguagesParams, context: RequestContext) -> list[dict[str, object]]:
    kind = params.type or "source"
    if kind not in ("source", "target"):
        raise InvalidInput("Parameter 'type' is invalid. 'source' and 'target' are valid values.")
    languages = context.translator.languages
    if kind == "source":
        return [{"language": c.code, "name": c.name} for c in source_codes(languages)]
    # Formality goes to the family's style template, where it has one (Hy-MT2).
    formal = "style" in context.translator.options
    return [
        {"language": c.code, "name": c.name, "supports_formality": formal}
        for c in target_codes(languages)
    ]


def create_deepl_app(
    runtime: Runtime, access: AccessControl, glossaries: GlossaryStore, documents: Documents
) -> FastAPI:
    app = dialect_app("DeepL-compatible API v2", runtime, access, DEEPL)

    async def translate(request: Request) -> JSONResponse:
        if len(await request.body()) > MAX_REQUEST_BYTES:
            raise PayloadTooLarge("Request Entity Too Large")
        raw = await read_params(request)
        context = await deepl_context(request, raw)
        params = parse_deepl(TranslateParams, raw)
        outcomes = await _translate(params, context, glossaries)
        return JSONResponse(await _answer(params, context, outcomes))

    async def list_languages(request: Request) -> JSONResponse:
        raw = await read_params(request)
        context = await deepl_context(request, raw)
        return JSONResponse(_languages(parse_deepl(LanguagesParams, raw), context))

    async def usage(request: Request) -> JSONResponse:
        context = await deepl_context(request, await read_params(request))
        used, limit = await access.character_usage(context.client)
        return JSONResponse(
            {"character_count": used, "character_limit": limit if limit is not None else 10**12}
        )

    app.add_api_route("/translate", translate, methods=["POST", "GET"])
    app.add_api_route("/languages", list_languages, methods=["GET", "POST"])
    app.add_api_route("/usage", usage, methods=["GET", "POST"])

    def glossary_language(given: str | None, name: str) -> Language | None:
        table = runtime.translator.languages
        return language_of(table, given, name, source_codes(table))

    def document_target(given: str | None, name: str) -> Language | None:
        table = runtime.translator.languages
        return language_of(table, given, name, target_codes(table))

    async def options_of(
        wanted: DeepLOptions, context: RequestContext, source: Language | None, target: Language
    ) -> TranslationOptions:
        return await translation_options(wanted, context, glossaries, source, target)

    install_glossary_routes(app, glossaries, deepl_context, glossary_language)
    install_deepl_document_routes(
        app, documents, deepl_context, document_target, glossary_language, options_of
    )
    return app


def create_deepl_v3_app(
    runtime: Runtime, access: AccessControl, glossaries: GlossaryStore
) -> FastAPI:
    """DeepL's v3 API (multilingual glossaries), mounted at ``/v3``."""
    app = dialect_app("DeepL-compatible API v3", runtime, access, DEEPL_V3)

    def glossary_language(given: str | None, name: str) -> Language | None:
        table = runtime.translator.languages
        return language_of(table, given, name, source_codes(table))

    install_multilingual_routes(app, glossaries, deepl_context, glossary_language)
    return app
