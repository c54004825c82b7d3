"""Markup-aware translation: tags stay as they are, only the text between them is translated.

For LibreTranslate's ``format=html`` and DeepL's ``tag_handling=html|xml``. The document is split
at tags; each text run with letters becomes one text to translate, with its surrounding
whitespace kept. Elements named ``inline`` (HTML's inline formatting elements, DeepL's
``non_splitting_tags``) do not split a run: "Hello <b>big</b> world" is one text, tags included,
so a sentence broken by inline markup is translated as a sentence. ``Segmented.pieces`` keeps
such a run's split form, for when a translation does not keep its tags. Left exactly as
written: comments, ``<script>`` and ``<style>`` contents, the contents of an element marked
``translate="no"`` (HTML's own attribute, which DeepL honours too) and of the elements named in
``ignore`` (DeepL's ``ignore_tags``), nested elements included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_TOKENS = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)
_TAG = re.compile(r"<\s*(/)?\s*([A-Za-z][\w:.-]*)([^>]*)>", re.S)
_TRANSLATE_NO = re.compile(r"""\btranslate\s*=\s*["']?no\b""", re.I)
# Elements whose contents are never text to translate.
_RAW = frozenset({"script", "style"})
# HTML elements without a closing tag.
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


# HTML's inline formatting elements: a sentence running through them is one text.
INLINE = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "cite", "dfn", "em", "i", "kbd", "mark", "q", "s", "samp"}
    | {"small", "span", "strong", "sub", "sup", "u", "var"}
)


@dataclass(frozen=True, slots=True)
class Segmented:
    parts: list[str]
    # Indexes into ``parts`` of the texts to translate.
    texts: list[int]
    # A text that holds inline tags, split at them (by its index in ``parts``).
    pieces: dict[int, Segmented] = field(default_factory=dict)

    def rebuild(self, translations: list[str]) -> str:
        parts = list(self.parts)
        for index, translated in zip(self.texts, translations, strict=True):
            original = parts[index]
            lead = original[: len(original) - len(original.lstrip())]
            trail = original[len(original.rstrip()) :]
            parts[index] = f"{lead}{translated}{trail}"
        return "".join(parts)


def tag_sequence(text: str) -> list[tuple[bool, str]]:
    """The tags of ``text`` in order, as (closing, name): what a translation must keep."""
    found = (_TAG.match(token) for token in _TOKENS.findall(text))
    return [(bool(tag.group(1)), tag.group(2).lower()) for tag in found if tag is not None]


def segment(markup: str, ignore: Iterable[str] = (), inline: Iterable[str] = ()) -> Segmented:
    """``markup`` split at its tags, with the runs to translate marked; ``inline`` elements
    stay inside the runs."""
    split = _segment(markup, ignore)
    joining = frozenset(name.lower() for name in inline)
    if not joining:
        return split
    return _joined(split, ignore, joining)


def _joined(split: Segmented, ignore: Iterable[str], inline: frozenset[str]) -> Segmented:
    """``split`` with each run of texts and balanced inline tags made one text."""
    to_translate = set(split.texts)
    parts: list[str] = []
    texts: list[int] = []
    pieces: dict[int, Segmented] = {}
    index = 0
    while index < len(split.parts):
        end = index
        # A run: text, inline tag, text, ... (only texts to translate or without letters).
        while end + 2 < len(split.parts) and _is_inline(split.parts[end + 1], inline):
            if not (end in to_translate or not _letters(split.parts[end])):
                break
            end += 2
        run = split.parts[index : end + 1]
        if index % 2 == 0 and end > index and _balanced(run) and any(map(_letters, run[::2])):
            text = "".join(run)
            pieces[len(parts)] = _segment(text, ignore)
            texts.append(len(parts))
            parts.append(text)
            index = end + 1
            continue
        if index in to_translate:
            texts.append(len(parts))
        parts.append(split.parts[index])
        index += 1
    return Segmented(parts, texts, pieces)


def _is_inline(part: str, inline: frozenset[str]) -> bool:
    tag = _TAG.match(part)
    return tag is not None and tag.group(2).lower() in inline


def _letters(text: str) -> bool:
    return any(char.isalpha() for char in text)


def _balanced(run: list[str]) -> bool:
    """Whether every inline element opened in ``run`` closes in it, in order."""
    open_now: list[str] = []
    for closing, name in tag_sequence("".join(run)):
        if not closing:
            open_now.append(name)
        elif not open_now or open_now.pop() != name:
            return False
    return not open_now


def _segment(markup: str, ignore: Iterable[str] = ()) -> Segmented:
    """``markup`` split at every tag, with the runs to translate marked."""
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
