"""DeepL API v2-compatible endpoints, mounted under ``/v2``.

``POST``/``GET /v2/translate`` (JSON, form or query; ``text`` repeated), ``GET``/``POST
/v2/languages``, ``GET``/``POST /v2/usage``. The key comes as ``Authorization: DeepL-Auth-Key
KEY`` (or ``Bearer KEY``), or as the legacy ``auth_key`` parameter, against the same key store as
the native API. Errors are ``{"message": ...}`` in DeepL's wording and statuses (400, 403, 404,
413 over 128 KiB, 429, 456 when a key's character quota is spent). DeepL's language codes map
onto the model's: targets ``EN-GB``/``EN-US``, ``PT-BR``/``PT-PT``, ``ZH``/``ZH-HANS``,
``ZH-HANT`` (the official clients refuse the bare ``EN`` and ``PT`` as targets; they are still
accepted). Options the model cannot honour are refused with a 400 that names them; options that
cannot change a one-model, one-segment translation are validated as DeepL does and ignored
(README's table).
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
    ServiceError,
    Unauthenticated,
    Unsupported,
)
from service.frontend.access import AccessControl
from service.frontend.api.context import RequestContext
from service.frontend.api.documents import install_deepl_document_routes
from service.frontend.api.errors import Dialect, install_dialect_errors
from service.frontend.api.glossaries import glossary_entries, install_glossary_routes
from service.frontend.api.middleware import NO_TELEMETRY
from service.frontend.api.params import Params, read_params
from service.frontend.documents.service import Documents
from service.frontend.glossaries import GlossaryStore
from service.frontend.runtime import Runtime
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.markup import INLINE
from service.frontend.translation.prompts import TranslationOptions

MAX_REQUEST_BYTES = 128 * 1024
# Parameters whose effect the model cannot produce: refused, never half-applied.
REFUSED = (
    "glossary_ids",
    "style_id",
    "style_rule",
    "custom_instructions",
    "translation_memory",
    "translation_memory_id",
)
# The values DeepL accepts for the options it validates.
_ALLOWED = {
    "split_sentences": ("0", "1", "nonewlines"),
    "preserve_formatting": ("0", "1", "true", "false"),
    "outline_detection": ("0", "1", "true", "false"),
    "show_billed_characters": ("0", "1", "true", "false"),
    "tag_handling": ("html", "xml"),
    "formality": ("default", "more", "less", "prefer_more", "prefer_less"),
    "model_type": ("quality_optimized", "prefer_quality_optimized", "latency_optimized"),
}
# Formality the model is told nothing about: ``default``, and the ``prefer_`` values, which DeepL
# defines as "if the target language supports it".
_SAFE_FORMALITY = ("default", "prefer_more", "prefer_less")
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


def _value(params: Params, name: str) -> str | None:
    """A single-valued parameter as DeepL reads it (the first of repeats; booleans as text)."""
    value = params.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"Value for '{name}' not supported.")
    return value


def _texts(params: Params) -> list[str]:
    value = params.get("text")
    texts = value if isinstance(value, list) else [value] if value is not None else []
    if not texts:
        raise InvalidInput("Parameter 'text' not specified.")
    if not all(isinstance(text, str) for text in texts):
        raise InvalidInput("Value for 'text' not supported.")
    return texts


def _tags(params: Params, name: str) -> list[str]:
    """A tag list: comma-separated in one value, or repeated."""
    value = params.get(name)
    values = value if isinstance(value, list) else [value] if value else []
    return [tag.strip() for item in values if isinstance(item, str) for tag in item.split(",")]


# Formality as a Hy-MT2 style (the families with a style template).
_STYLES = {"more": "formal", "prefer_more": "formal", "less": "informal", "prefer_less": "informal"}


def create_deepl_app(
    runtime: Runtime, access: AccessControl, glossaries: GlossaryStore, documents: Documents
) -> FastAPI:
    app = FastAPI(
        title="DeepL-compatible API v2", docs_url=None, redoc_url=None, telemetry=NO_TELEMETRY
    )
    app.state.runtime, app.state.access = runtime, access

    install_dialect_errors(app, DEEPL)

    def context_of(request: Request, params: Params) -> RequestContext:
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, key = header.partition(" ")
            if scheme.lower() not in ("deepl-auth-key", "bearer"):
                key = ""
        else:
            key = _value(params, "auth_key") or ""
        try:
            return RequestContext.build(request, f"Bearer {key.strip()}" if key else None)
        except Unauthenticated:
            raise Unauthenticated(
                "Authorization failure: send the key as Authorization: DeepL-Auth-Key <key>"
            ) from None
        except Forbidden:
            raise Forbidden("Authorization failure: the key is not valid") from None

    def language_of(params: Params, name: str, codes: list[_Code]) -> Language | None:
        given = _value(params, name)
        if given is None:
            return None
        upper = given.upper()
        for entry in codes:
            if entry.code == upper:
                return entry.language
        found = runtime.translator.languages.lookup(given)  # EN, PT, other spellings
        if found is None:
            raise InvalidInput(f"Value for '{name}' not supported.")
        return found

    async def options_of(
        params: Params, context: RequestContext, source: Language | None, target: Language
    ) -> TranslationOptions:
        """What ``formality``, ``glossary_id`` and ``context`` ask of the model family."""
        translator = context.translator
        formality = (_value(params, "formality") or "default").lower()
        if formality not in _ALLOWED["formality"]:
            raise InvalidInput("Value for 'formality' not supported.")
        styled = "style" in translator.options and formality in _STYLES
        if formality not in _SAFE_FORMALITY and not styled:
            raise InvalidInput("'formality' is not supported for given 'target_lang'.")
        refused = [name for name in REFUSED if params.get(name)]
        if refused:
            raise Unsupported(f"unsupported parameter(s): {', '.join(refused)}")
        glossary_id = _value(params, "glossary_id")
        terms = (
            await glossary_entries(glossaries, context, glossary_id, source, target)
            if glossary_id is not None
            else ()
        )
        hint = _value(params, "context")
        return TranslationOptions(
            glossary=terms,
            # DeepL's context is a hint: it goes to the family's context template where there is
            # one, and is ignored (not billed) where there is none.
            context=hint if hint and "context" in translator.options else None,
            style=_STYLES[formality] if styled else None,
        )

    async def translate(request: Request) -> JSONResponse:
        if len(await request.body()) > MAX_REQUEST_BYTES:
            raise PayloadTooLarge("Request Entity Too Large")
        params = await read_params(request)
        context = context_of(request, params)
        languages = context.translator.languages
        texts = _texts(params)
        target = language_of(params, "target_lang", target_codes(languages))
        if target is None:
            raise InvalidInput("Parameter 'target_lang' not specified.")
        source = language_of(params, "source_lang", source_codes(languages))
        options = {name: _value(params, name) for name in _ALLOWED}
        for name, value in options.items():
            if value is not None and value.lower() not in _ALLOWED[name]:
                raise InvalidInput(f"Value for '{name}' not supported.")
        translator = context.translator
        wanted = await options_of(params, context, source, target)
        context.charge(sum(len(text) for text in texts))
        source_code = source.code if source is not None else None
        tag_handling = options["tag_handling"]
        if tag_handling or _value(params, "ignore_tags"):
            # Inline elements do not split a sentence: HTML's formatting elements by default,
            # and the non_splitting_tags given, less the splitting_tags given.
            inline = (INLINE if tag_handling == "html" else frozenset()) | set(
                _tags(params, "non_splitting_tags")
            )
            outcomes = await translator.translate_markup(
                texts,
                target.code,
                source_code,
                deadline=context.deadline,
                ignore=_tags(params, "ignore_tags"),
                inline=inline - set(_tags(params, "splitting_tags")),
            )
        else:
            outcomes = await translator.translate_batch(
                texts, target.code, source_code, deadline=context.deadline, options=wanted
            )
        for outcome in outcomes:
            if isinstance(outcome, ServiceError):
                raise outcome
        # A text the model never saw (numbers, a URL) was not detected on the way: the
        # detector says what it makes of it, rather than a language made up here.
        undetected = [i for i, o in enumerate(outcomes) if getattr(o, "source", None) is None]
        guesses = dict(
            zip(undetected, await translator.detect([texts[i] for i in undetected]), strict=True)
        )
        translations: list[dict[str, object]] = []
        for index, (text, outcome) in enumerate(zip(texts, outcomes, strict=True)):
            assert not isinstance(outcome, ServiceError)
            guess = guesses.get(index)
            detected = outcome.source or (guess.language if guess else source)
            assert detected is not None
            translations.append(
                {
                    "detected_source_language": deepl_code(detected),
                    "text": outcome.text,
                    "billed_characters": len(text),
                }
            )
        answer: dict[str, object] = {"translations": translations}
        if options["model_type"] is not None:
            for translation in translations:
                translation["model_type_used"] = _MODEL_TYPE
        return JSONResponse(answer)

    app.add_api_route("/translate", translate, methods=["POST", "GET"])

    async def list_languages(request: Request) -> JSONResponse:
        params = await read_params(request)
        context = context_of(request, params)
        kind = _value(params, "type") or "source"
        if kind not in ("source", "target"):
            raise InvalidInput(
                "Parameter 'type' is invalid. 'source' and 'target' are valid values."
            )
        languages = context.translator.languages
        entries: list[dict[str, object]]
        if kind == "source":
            entries = [{"language": c.code, "name": c.name} for c in source_codes(languages)]
        else:
            # Formality goes to the family's style template, where it has one (Hy-MT2).
            formal = "style" in context.translator.options
            entries = [
                {"language": c.code, "name": c.name, "supports_formality": formal}
                for c in target_codes(languages)
            ]
        return JSONResponse(entries)

    app.add_api_route("/languages", list_languages, methods=["GET", "POST"])

    async def usage(request: Request) -> JSONResponse:
        context = context_of(request, await read_params(request))
        used, limit = access.character_usage(context.client)
        return JSONResponse(
            {"character_count": used, "character_limit": limit if limit is not None else 10**12}
        )

    app.add_api_route("/usage", usage, methods=["GET", "POST"])

    def glossary_language(params: Params, name: str) -> Language | None:
        return language_of(params, name, source_codes(runtime.translator.languages))

    install_glossary_routes(app, glossaries, context_of, glossary_language, _value)

    def document_target(params: Params, name: str) -> Language | None:
        return language_of(params, name, target_codes(runtime.translator.languages))

    install_deepl_document_routes(
        app, documents, context_of, document_target, glossary_language, options_of
    )

    return app
