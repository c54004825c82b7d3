"""Markup-aware translation: tags stay as they are, only the text between them is translated.

For LibreTranslate's ``format=html`` and DeepL's ``tag_handling=html|xml``. The document is split
at tags; each text run with letters becomes one text to translate, with its surrounding
whitespace kept. Left exactly as written: comments, ``<script>`` and ``<style>`` contents, the
contents of an element marked ``translate="no"`` (HTML's own attribute, which DeepL honours too)
and of the elements named in ``ignore`` (DeepL's ``ignore_tags``), nested elements included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_TOKENS = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)
_TAG = re.compile(r"<\s*(/)?\s*([A-Za-z][\w:.-]*)([^>]*)>", re.S)
_TRANSLATE_NO = re.compile(r"""\btranslate\s*=\s*["']?no\b""", re.I)
# Elements whose contents are never text to translate.
_RAW = frozenset({"script", "style"})
# HTML elements without a closing tag.
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


@dataclass(frozen=True, slots=True)
class Segmented:
    parts: list[str]
    # Indexes into ``parts`` of the texts to translate.
    texts: list[int]

    def rebuild(self, translations: list[str]) -> str:
        parts = list(self.parts)
        for index, translated in zip(self.texts, translations, strict=True):
            original = parts[index]
            lead = original[: len(original) - len(original.lstrip())]
            trail = original[len(original.rstrip()) :]
            parts[index] = f"{lead}{translated}{trail}"
        return "".join(parts)


def segment(markup: str, ignore: Iterable[str] = ()) -> Segmented:
    """``markup`` split at its tags, with the runs to translate marked."""
    ignored = _RAW | {name.strip().lower() for name in ignore if name.strip()}
    parts = _TOKENS.split(markup)
    texts: list[int] = []
    # Elements open since the outermost one whose contents stay as written (empty: translate).
    kept: list[str] = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not kept and any(char.isalpha() for char in part):
                texts.append(index)
            continue
        tag = _TAG.match(part)
        if tag is None:  # a comment, doctype or processing instruction
            continue
        closing, name, rest = bool(tag.group(1)), tag.group(2).lower(), tag.group(3)
        empty = rest.rstrip().endswith("/") or name in _VOID
        if closing:
            if name in kept:
                del kept[len(kept) - 1 - kept[::-1].index(name) :]
        elif empty:
            continue
        elif kept or name in ignored or _TRANSLATE_NO.search(rest):
            kept.append(name)
    return Segmented(parts, texts)
