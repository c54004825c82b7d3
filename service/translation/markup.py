"""Markup-aware translation: tags stay as they are, only the text between them is translated.

For LibreTranslate's ``format=html`` and DeepL's ``tag_handling=html|xml``. The document is split
at tags (comments and ``<script>``/``<style>`` contents are left alone); each text run with
letters becomes one text to translate, with its surrounding whitespace kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKENS = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)
_RAW = re.compile(r"<(script|style)\b", re.I)


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


def segment(markup: str) -> Segmented:
    parts = _TOKENS.split(markup)
    texts: list[int] = []
    raw = False
    for index, part in enumerate(parts):
        if index % 2 == 1:  # a tag or comment
            if _RAW.match(part):
                raw = True
            elif re.match(r"</(script|style)\b", part, re.I):
                raw = False
            continue
        if not raw and any(char.isalpha() for char in part):
            texts.append(index)
    return Segmented(parts, texts)
