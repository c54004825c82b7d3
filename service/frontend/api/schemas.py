"""Request and response schemas of the native API.

Slim on purpose: the translation, the languages used and the token usage; no logits, no debug
fields. Limits that depend on settings (characters, tokens, batch size) are checked by the
translator so every API dialect shares them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.frontend.translation.detection import UNCERTAIN_BELOW
from service.frontend.translation.languages import LanguageTable
from service.frontend.translation.prompts import TranslationOptions
from service.frontend.translation.results import Translation


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Options(_Strict):
    """The translation options: each goes through the model family's own template, one at a
    time; a family without that template refuses it (422 naming it)."""

    glossary: dict[str, str] | None = Field(
        None,
        description="Terminology: source term -> target term, in the order the prompt lists them "
        "(HY-MT1.5, Hy-MT2).",
        examples=[{"Cloud Native": "云原生"}],
    )
    glossary_id: str | None = Field(
        None,
        description="A stored glossary of the caller's (POST /v2/glossaries) for this language "
        "pair, source_lang required; its terms come before those of glossary.",
    )
    context: str | None = Field(
        None,
        min_length=1,
        description="Text before the segment, for the model to read but not translate "
        "(HY-MT1.5's contextual template, Hy-MT2's background one).",
    )
    format: Literal["text", "markup", "json", "html", "csv", "markdown"] = Field(
        "text",
        description="markup: HTML/XML tags kept where they belong (HY-MT1.5's formatted "
        "translation with numbered tags; its template translates into Chinese only). json, "
        "html, csv, markdown: structured data whose structure, keys and placeholders are kept "
        "and whose user-facing text is translated (Hy-MT2).",
    )
    delimiter: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="A delimiter in the text that must come back as many times as it was sent "
        "(Hy-MT2's delimiter-safe template); where the translation loses or adds one, the "
        "pieces between the delimiters are translated one by one and joined with it.",
        examples=["@@"],
    )
    style: str | None = Field(
        None, min_length=1, description="The style the translation must follow (Hy-MT2)."
    )
    preferences: list[str] | None = Field(
        None,
        min_length=1,
        description="Personal preferences, numbered in the prompt before the translate "
        "instruction (Hy-MT2).",
    )

    def options(self) -> TranslationOptions:
        return TranslationOptions(
            glossary=tuple((self.glossary or {}).items()),
            context=self.context,
            format=self.format,
            style=self.style,
            preferences=tuple(self.preferences or ()),
            delimiter=self.delimiter,
        )


def _codes(schema: dict[str, Any]) -> None:
    """The model's language codes in the OpenAPI document (when it is built, not at import),
    so generated clients and fuzzers know them; other spellings are still accepted."""
    codes = list(LanguageTable())
    schema["anyOf"] = [{"enum": codes, "type": "string"}, {"type": "string"}]
    schema.pop("type", None)


def _source_codes(schema: dict[str, Any]) -> None:
    schema["anyOf"] = [
        {"enum": ["auto", *LanguageTable()], "type": "string"},
        {"type": "string"},
        {"type": "null"},
    ]


_TARGET = "Target language code (GET /languages; en-US, zh-CN, english... are accepted too)."


class TranslateRequest(_Options):
    text: str = Field(min_length=1, description="Text to translate.", examples=["Hello, world!"])
    target_lang: str = Field(description=_TARGET, examples=["de"], json_schema_extra=_codes)
    source_lang: str | None = Field(
        None,
        description="Source language code; omit (or auto) to detect it per text.",
        json_schema_extra=_source_codes,
    )


class BatchTranslateRequest(_Options):
    texts: list[str] = Field(min_length=1, description="Texts to translate, one segment each.")
    target_lang: str = Field(description=_TARGET, examples=["fr"], json_schema_extra=_codes)
    source_lang: str | None = Field(
        None,
        description="Source language code of every text; omit (or auto) to detect each.",
        json_schema_extra=_source_codes,
    )


class PromptOut(BaseModel):
    prompt: str = Field(
        description="The exact text the model would read, chat format and special tokens included."
    )
    input_tokens: int = Field(description="Its number of tokens.")


class Usage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens the model read (template included).")
    output_tokens: int = Field(description="Tokens the model generated.")


class TranslationOut(BaseModel):
    translation: str
    source_lang: str | None = Field(description="Source language given, or detected.")
    detected_confidence: float | None = Field(
        description="Confidence of the detection (0-1) when source_lang was detected, else null."
    )
    source_lang_uncertain: bool = Field(
        False,
        description=f"True when source_lang was detected with a confidence under "
        f"{UNCERTAIN_BELOW}: it may be wrong. The prompt names only the target language, so "
        "a wrong guess changes the translation only where it decides between the Chinese and "
        "the English prompt template.",
    )
    target_lang: str
    target_language_mismatch: bool = Field(
        False,
        description="True when the translation was detected, with confidence, in another "
        "language than target_lang (answered anyway; counted in "
        "hymt_target_language_mismatches_total).",
    )
    usage: Usage

    @classmethod
    def of(cls, translation: Translation) -> TranslationOut:
        return cls(
            translation=translation.text,
            source_lang=translation.source.code if translation.source else None,
            detected_confidence=translation.detected_confidence,
            source_lang_uncertain=translation.detected_confidence is not None
            and translation.detected_confidence < UNCERTAIN_BELOW,
            target_lang=translation.target.code,
            target_language_mismatch=translation.target_mismatch,
            usage=Usage(
                input_tokens=translation.input_tokens, output_tokens=translation.output_tokens
            ),
        )


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable error code.")
    message: str = Field(description="What went wrong, safe to show to a user.")


class ErrorResponse(BaseModel):
    """The one shape of every error the service answers (and of a failed batch item)."""

    error: ErrorDetail


class BatchTranslateResponse(BaseModel):
    translations: list[TranslationOut | ErrorResponse] = Field(
        description="One result per text, in input order: a translation, or the error of that "
        "text alone (out of memory, deadline...). Invalid input fails the whole request instead."
    )
    usage: Usage = Field(description="Totals over the translated texts.")


class DetectRequest(_Strict):
    texts: list[str] = Field(min_length=1, description="Texts whose language to detect.")


class DetectionOut(BaseModel):
    language: str
    confidence: float
    uncertain: bool = Field(description=f"True when confidence is under {UNCERTAIN_BELOW}.")


class LanguageOut(BaseModel):
    code: str
    name: str
    chinese_name: str


class LiveOut(BaseModel):
    status: Literal["alive"] = "alive"
    engine_state: str = Field(description="loading, warming, ready, restarting or stopping.")
    in_flight: int = Field(0, description="Texts admitted and not yet answered.")


class HealthOut(BaseModel):
    status: str
    engine: str | None = Field(None, description="the serving engine: fast")
    model: str | None = None
    device: str | None = None
    quantization: str | None = None
    attention: str | None = None
    in_flight: int = Field(0, description="Texts admitted and not yet answered.")
    shared_state: str | None = Field(
        None,
        description="With HYMT_REDIS_URL: up, or down while limits and cache are local "
        "(the service keeps translating).",
    )
