"""DeepL's request parameters as typed models, read as DeepL reads them.

A parameter may come as a JSON value, a form field or a query parameter, repeated or not: a
single-valued one is the first of its repeats, a boolean is ``1``/``0``, a number its text, an
empty value absent. Tag lists are comma-separated or repeated. Values outside what DeepL accepts
are refused in DeepL's words (``Value for 'x' not supported.``, ``Parameter 'x' not
specified.``), as DeepL refuses them, before any work is done.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError

from service.frontend.api.params import Params, parse

M = TypeVar("M", bound=BaseModel)

# Parameters whose effect the model cannot produce: refused, never half-applied.
REFUSED = (
    "glossary_ids",
    "style_id",
    "style_rule",
    "translation_memory",
    "translation_memory_id",
)
# DeepL's bounds on custom_instructions.
MAX_INSTRUCTIONS = 10
MAX_INSTRUCTION_CHARS = 300


def single(value: object) -> str | None:
    """A single-valued parameter as DeepL reads it."""
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise PydanticCustomError("unsupported", "not a single value")
    return value


def _texts(value: object) -> list[str]:
    texts = value if isinstance(value, list) else [value] if value is not None else []
    if not texts:
        raise PydanticCustomError("missing", "no text")
    strings = [text for text in texts if isinstance(text, str)]
    if len(strings) != len(texts):
        raise PydanticCustomError("unsupported", "a text that is not a string")
    return strings


def _tags(value: object) -> list[str]:
    values = value if isinstance(value, list) else [value] if value else []
    return [tag.strip() for item in values if isinstance(item, str) for tag in item.split(",")]


def _instructions(value: object) -> list[str]:
    """``custom_instructions``: plain-language instructions, a list (or one), within DeepL's
    bounds."""
    if value is None or value == "" or value == []:
        return []
    given = value if isinstance(value, list) else [value]
    if len(given) > MAX_INSTRUCTIONS or not all(
        isinstance(item, str) and 0 < len(item) <= MAX_INSTRUCTION_CHARS for item in given
    ):
        raise PydanticCustomError("unsupported", "not a list of instructions")
    return [item for item in given if isinstance(item, str)]


def _one_of(*allowed: str) -> BeforeValidator:
    """A single value among ``allowed`` (compared in lower case), kept as given."""

    def check(value: object) -> str | None:
        text = single(value)
        if text is not None and text.lower() not in allowed:
            raise PydanticCustomError("unsupported", "not an accepted value")
        return text

    return BeforeValidator(check)


Value = Annotated[str | None, BeforeValidator(single)]
Flag = Annotated[str | None, _one_of("0", "1", "true", "false")]
Tags = Annotated[list[str], BeforeValidator(_tags)]
FORMALITY = ("default", "more", "less", "prefer_more", "prefer_less")


class _DeepLParams(BaseModel):
    # Parameters DeepL has and this service does not read (``auth_key`` included, which the
    # key check reads) pass; an unknown one is ignored, as DeepL ignores it.
    model_config = ConfigDict(extra="ignore", frozen=True)


class DeepLOptions(_DeepLParams):
    """What a translation asks of the model besides its texts: shared by texts and documents."""

    formality: Annotated[str | None, _one_of(*FORMALITY)] = None
    glossary_id: Value = None
    context: Value = None
    glossary_ids: Any = None
    style_id: Any = None
    style_rule: Any = None
    custom_instructions: Annotated[list[str], BeforeValidator(_instructions)] = []
    translation_memory: Any = None
    translation_memory_id: Any = None

    def refused(self) -> list[str]:
        """The parameters given whose effect the model cannot produce."""
        return [name for name in REFUSED if getattr(self, name)]


class TranslateParams(DeepLOptions):
    """``/v2/translate``."""

    text: Annotated[list[str], BeforeValidator(_texts)]
    target_lang: Value = None
    source_lang: Value = None
    split_sentences: Annotated[str | None, _one_of("0", "1", "nonewlines")] = None
    preserve_formatting: Flag = None
    outline_detection: Flag = None
    show_billed_characters: Flag = None
    tag_handling: Annotated[str | None, _one_of("html", "xml")] = None
    model_type: Annotated[
        str | None,
        _one_of("quality_optimized", "prefer_quality_optimized", "latency_optimized"),
    ] = None
    ignore_tags: Tags = []
    non_splitting_tags: Tags = []
    splitting_tags: Tags = []


class LanguagesParams(_DeepLParams):
    """``/v2/languages``."""

    type: Value = None


class DocumentParams(DeepLOptions):
    """``POST /v2/document`` (beside the file)."""

    target_lang: Value = None
    source_lang: Value = None
    output_format: Value = None


class DocumentKeyParams(_DeepLParams):
    """The key of a document's status, result and deletion."""

    document_key: Value = None


class GlossaryParams(_DeepLParams):
    """``POST /v2/glossaries``."""

    name: Value = None
    source_lang: Value = None
    target_lang: Value = None
    entries: Value = None
    entries_format: Value = None


class DictionaryParams(_DeepLParams):
    """One dictionary of a ``/v3/glossaries`` glossary."""

    source_lang: Value = None
    target_lang: Value = None
    entries: Value = None
    entries_format: Value = None


class MultilingualParams(_DeepLParams):
    """``POST /v3/glossaries`` and ``PATCH /v3/glossaries/{id}``."""

    name: Value = None
    dictionaries: list[DictionaryParams] | None = None


class PairParams(_DeepLParams):
    """A language pair named in the query (a dictionary's entries, its deletion)."""

    source_lang: Value = None
    target_lang: Value = None


def parse_deepl(model: type[M], params: Params) -> M:
    """``params`` as ``model``, or ``InvalidInput`` in DeepL's words naming the parameter."""
    return parse(
        model,
        params,
        missing="Parameter '{name}' not specified.",
        invalid="Value for '{name}' not supported.",
    )
