"""The user message for one text: the family's template for the options asked, filled in.

The Chinese version of a template is used when either side of the pair is Chinese (an unlabelled
text is judged by its script), the English one otherwise; the target language is named in the
template's own language. A family that has no template for an option refuses it (422, naming the
option), and its templates take one option at a time. The chat template around the message is
the tokenizer's business (``service.engine.tokenization``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Literal

from service.contract.errors import TextTooLong, Unsupported
from service.frontend.translation.families import (
    HUNYUAN_MT,
    STRUCTURED_FORMATS,
    Family,
    fill,
    numbered,
)
from service.frontend.translation.languages import Language
from service.frontend.translation.tags import number_tags

# ``markup``: HY-MT1.5's numbered tags; the others: Hy-MT2's structured-data template.
TextFormat = Literal["text", "markup", "json", "html", "csv", "markdown"]


@dataclass(frozen=True, slots=True)
class TranslationOptions:
    """What a request asks beyond the plain translation (the native API's options)."""

    # Source term -> target term, in the order given.
    glossary: tuple[tuple[str, str], ...] = ()
    # Text before the segment (HY-MT1.5's contextual template, Hy-MT2's background one).
    context: str | None = None
    # ``markup``: tags kept (HY-MT1.5's formatted-translation template, numbered tags);
    # ``json``, ``html``, ``csv``, ``markdown``: Hy-MT2's structured-data template.
    format: TextFormat = "text"
    # Hy-MT2: the style the translation must follow, and numbered personal preferences.
    style: str | None = None
    preferences: tuple[str, ...] = field(default=())
    # Hy-MT2's delimiter-safe template; the translator checks the count comes back.
    delimiter: str | None = None

    def asked(self) -> list[str]:
        """The options set, by name."""
        values = {
            "glossary": bool(self.glossary),
            "context": self.context is not None,
            "format": self.format != "text",
            "style": self.style is not None,
            "preferences": bool(self.preferences),
            "delimiter": self.delimiter is not None,
        }
        return [name for name, present in values.items() if present]


PLAIN = TranslationOptions()

# DeepL's bounds on a glossary term and on custom instructions (10 of 300 characters); a
# context or a style is bounded like a text.
MAX_TERM_CHARS = 1024
MAX_PREFERENCES = 10


def check_options(options: TranslationOptions, max_part_chars: int) -> None:
    """The checks of a request's options cheap enough for the event loop (before admission):
    each part within its bounds, named in the error. The glossary's size is bounded where it is
    stored or by the body's; only its terms found in a text reach that text's prompt."""
    for name, value in (("context", options.context), ("style", options.style)):
        if value is not None and len(value) > max_part_chars:
            raise TextTooLong(f"{name}: {len(value)} characters, at most {max_part_chars}")
    if len(options.preferences) > MAX_PREFERENCES:
        raise TextTooLong(
            f"preferences: {len(options.preferences)} given, at most {MAX_PREFERENCES}"
        )
    for index, preference in enumerate(options.preferences):
        if len(preference) > max_part_chars:
            raise TextTooLong(
                f"preferences[{index}]: {len(preference)} characters, at most {max_part_chars}"
            )
    for source, target in options.glossary:
        if len(source) > MAX_TERM_CHARS or len(target) > MAX_TERM_CHARS:
            raise TextTooLong(f"glossary: a term over {MAX_TERM_CHARS} characters")


def glossary_terms(glossary: tuple[tuple[str, str], ...], text: str) -> tuple[tuple[str, str], ...]:
    """The entries whose source term occurs in ``text`` (ignoring case): what the model needs
    to see. A glossary of thousands of terms would otherwise fill every prompt."""
    folded = text.casefold()
    return tuple((s, t) for s, t in glossary if s.casefold() in folded)


def option_parts(options: TranslationOptions, text: str) -> dict[str, str]:
    """The parts of a prompt that come from ``options`` for ``text``, by option name (what a
    prompt-size error names)."""
    parts = {
        "glossary": "\n".join(f"{s} {t}" for s, t in glossary_terms(options.glossary, text)),
        "context": options.context or "",
        "style": options.style or "",
        "preferences": "\n".join(options.preferences),
    }
    return {name: part for name, part in parts.items() if part}


@dataclass(frozen=True, slots=True)
class PromptFormat:
    """Renders the translation instruction for one text with one family's templates."""

    family: Family = HUNYUAN_MT

    @property
    def name(self) -> str:
        """Identifies the templates in cache keys."""
        return self.family.cache_name

    def render(
        self,
        text: str,
        target: Language,
        source: Language | None,
        options: TranslationOptions = PLAIN,
    ) -> str:
        """The user message asking to translate ``text`` into ``target`` as ``options`` say."""
        asked = options.asked()
        missing = [name for name in asked if name not in self.family.options]
        if missing:
            raise Unsupported(
                f"{', '.join(missing)}: not supported by the {self.family.title} model family "
                f"(it supports: {', '.join(sorted(self.family.options)) or 'no options'})"
            )
        if len(asked) > 1:
            raise Unsupported(
                f"{', '.join(asked)}: the {self.family.title} templates take one option at a time"
            )
        kind = asked[0] if asked else "default"
        terms = glossary_terms(options.glossary, text)
        if kind == "glossary" and not terms:
            kind = "default"  # none of its terms is in this text
        if kind == "format":
            if options.format not in self.family.formats:
                raise Unsupported(
                    f"format: {options.format!r} is not supported by the {self.family.title} "
                    f"model family (it supports: {', '.join(sorted(self.family.formats))})"
                )
            kind = "markup" if options.format == "markup" else "structured"
        chinese = target.is_chinese or (source.is_chinese if source else looks_chinese(text))
        template, language = self.family.template(kind, chinese)
        name = target.chinese_name if language == "zh" else target.english_name
        values = {"target": name, "text": text}
        if kind == "glossary":
            line = self.family.term_lines[language]
            values["terms"] = "\n".join(
                fill(line, {"source": source_term, "target": target_term})
                for source_term, target_term in terms
            )
        elif kind == "context":
            values["context"] = options.context or ""
        elif kind == "style":
            values["style"] = options.style or ""
        elif kind == "preferences":
            values["preferences"] = numbered(list(options.preferences), language)
        elif kind == "structured":
            values["format_type"] = STRUCTURED_FORMATS[options.format]
        elif kind == "markup":
            if not target.is_chinese:
                raise Unsupported(
                    f"format: the {self.family.title} formatted-translation template translates "
                    "into Chinese only"
                )
            values["text"] = number_tags(text).numbered
        return fill(template, values)


def looks_chinese(text: str) -> bool:
    """Whether an unlabelled text is Chinese, judged by its script.

    Han ideographs with no kana or hangul: Japanese and Korean also use Han characters, but
    always beside their own scripts. Used only to choose the template when no source is given.
    """
    han = 0
    for char in text:
        name = unicodedata.name(char, "")
        if name.startswith(("HIRAGANA", "KATAKANA", "HANGUL")):
            return False
        if name.startswith("CJK UNIFIED IDEOGRAPH"):
            han += 1
    letters = sum(1 for char in text if char.isalpha())
    return letters > 0 and han * 2 >= letters
