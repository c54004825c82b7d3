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
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# Possessive: a tag of thousands of spaces and no name is refused in one pass, not retried from
# each space (quadratic).
TAG = re.compile(r"<\s*+(?:(/)\s*+)?([A-Za-z][\w:.-]*+)([^>]*+)>", re.S)
_TRANSLATE_NO = re.compile(r"""\btranslate\s*=\s*["']?no\b""", re.I)
# Elements whose contents are never text to translate.
_RAW = frozenset({"script", "style"})
# HTML elements without a closing tag.
VOID = frozenset(
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


def split_tags(markup: str) -> list[str]:
    """``markup`` split into text, tag, text, ..., text: a tag is a comment (``<!--`` to the
    first ``-->``) or ``<`` to the next ``>``, as ``re.split(r"(<!--.*?-->|<[^>]*>)")`` splits.

    Scanned by hand because that expression is quadratic on what never closes: each of
    thousands of ``<!--`` or ``<`` without an end searched the rest of the text again."""
    parts: list[str] = []
    text_start = 0
    comments_close = True  # False once a comment was found never to close
    at = markup.find("<")
    while at != -1:
        end = -1
        if comments_close and markup.startswith("<!--", at):
            close = markup.find("-->", at + 4)
            if close == -1:
                comments_close = False
            else:
                end = close + 3
        if end == -1:
            close = markup.find(">", at + 1)
            if close == -1:
                break  # no ">" after this "<", so none after any later one either
            end = close + 1
        parts += (markup[text_start:at], markup[at:end])
        text_start = end
        at = markup.find("<", end)
    parts.append(markup[text_start:])
    return parts


def tag_of(token: str) -> tuple[bool, str] | None:
    """A token of ``split_tags`` as (closing, lower-case name), or None for a comment, doctype
    or processing instruction."""
    tag = TAG.match(token)
    return None if tag is None else (bool(tag.group(1)), tag.group(2).lower())


def tag_sequence(text: str) -> list[tuple[bool, str]]:
    """The tags of ``text`` in order, as (closing, name): what a translation must keep."""
    found = (tag_of(token) for token in split_tags(text)[1::2])
    return [tag for tag in found if tag is not None]


def segment(markup: str, ignore: Iterable[str] = (), inline: Iterable[str] = ()) -> Segmented:
    """``markup`` split at its tags, with the runs to translate marked; ``inline`` elements
    stay inside the runs."""
    split = _segment(markup, ignore)
    joining = frozenset(name.lower() for name in inline)
    if not joining:
        return split
    return _joined(split, ignore, joining)


def _joined(split: Segmented, ignore: Iterable[str], inline: frozenset[str]) -> Segmented:
    """``split`` with each run of texts and balanced inline tags made one text.

    A chain is text, inline tag, text, ... as long as each text but the last is one to translate
    or has no letters. Its run to join is its longest tail (starting at a text) whose inline
    elements are balanced and which holds letters; what precedes the run stays split."""
    to_translate = set(split.texts)
    parts: list[str] = []
    texts: list[int] = []
    pieces: dict[int, Segmented] = {}

    def keep(index: int) -> None:
        if index in to_translate:
            texts.append(len(parts))
        parts.append(split.parts[index])

    index = 0
    while index < len(split.parts):
        end = index
        while end + 2 < len(split.parts) and _is_inline(split.parts[end + 1], inline):
            if not (end in to_translate or not _letters(split.parts[end])):
                break
            end += 2
        start = _run_start(split.parts, index, end)
        for kept in range(index, end + 1 if start is None else start):
            keep(kept)
        if start is not None:
            text = "".join(split.parts[start : end + 1])
            pieces[len(parts)] = _segment(text, ignore)
            texts.append(len(parts))
            parts.append(text)
        index = end + 1
    return Segmented(parts, texts, pieces)


def _run_start(parts: list[str], first: int, last: int) -> int | None:
    """The first text of ``parts[first:last + 1]`` (texts at ``first``, ``first + 2``, ...,
    inline tags between) from which the rest has balanced tags, letters and at least one tag;
    None if there is none. One pass from the end: a tail is balanced when reading it backwards
    closes every element it opens, so a mismatch rules out every longer tail at once."""
    closed: list[str] = []  # elements closed after the position read, innermost first
    letters = False
    found: int | None = None
    for position in range(last, first, -2):
        letters = letters or _letters(parts[position])
        tag = tag_of(parts[position - 1])
        assert tag is not None  # a chain's odd parts are inline tags
        closing, name = tag
        if closing:
            closed.append(name)
        elif not closed or closed.pop() != name:
            break
        letters = letters or _letters(parts[position - 2])
        if not closed and letters:
            found = position - 2
    return found


def _is_inline(part: str, inline: frozenset[str]) -> bool:
    tag = tag_of(part)
    return tag is not None and tag[1] in inline


def _letters(text: str) -> bool:
    return any(char.isalpha() for char in text)


def _segment(markup: str, ignore: Iterable[str] = ()) -> Segmented:
    """``markup`` split at every tag, with the runs to translate marked."""
    ignored = _RAW | {name.strip().lower() for name in ignore if name.strip()}
    parts = split_tags(markup)
    texts: list[int] = []
    # Elements open since the outermost one whose contents stay as written (empty: translate),
    # and how many of each name are among them (a closing tag looks its name up in this).
    kept: list[str] = []
    kept_names: Counter[str] = Counter()
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not kept and any(char.isalpha() for char in part):
                texts.append(index)
            continue
        tag = TAG.match(part)
        if tag is None:  # a comment, doctype or processing instruction
            continue
        closing, name, rest = bool(tag.group(1)), tag.group(2).lower(), tag.group(3)
        empty = rest.rstrip().endswith("/") or name in VOID
        if closing:
            while kept_names[name]:  # its innermost open one closes, and all inside it
                inner = kept.pop()
                kept_names[inner] -= 1
                if inner == name:
                    break
        elif empty:
            continue
        elif kept or name in ignored or _TRANSLATE_NO.search(rest):
            kept.append(name)
            kept_names[name] += 1
    return Segmented(parts, texts)
