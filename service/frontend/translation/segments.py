"""Long texts cut into segments to translate one by one, and put back together.

A document is split into parts that are either *glue*, kept exactly as written (line breaks,
blank lines, indentation, Markdown list markers, heading hashes and quote marks, fenced code
blocks, the spaces between segments) or *segments* to translate: a line's text, or, for a long
line, runs of its sentences up to a size. Sentences end at ``. ! ?`` and their Arabic,
Devanagari and fullwidth forms followed by a space, and at the CJK full stop, exclamation and
question marks without one; not after a known abbreviation or a single capital (``e.g.``,
``Dr.``, ``J. Smith``), not before a lower-case word, not inside a number (``3.14``), and not
inside a tag or an element (``<a href="x.html">...</a>`` stays in one segment). Joining the
translations with the glue gives back the document's structure: the same paragraphs, lines,
list items and tags.

Each segment is its own cache entry, so an edited document generates again only the segments
that changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Ends of sentences: Latin and Arabic punctuation (then whitespace), CJK full stops (none needed).
_END = re.compile(r"(?<=[.!?؟۔।])[\"'»”’)\]]*(?=\s)|(?<=[。！？])[」』”’）]*")
_ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "cf",
        "no",
        "nr",
        "fig",
        "al",
        "approx",
        "dept",
        "est",
        "inc",
        "ltd",
        "co",
        "corp",
        "a.m",
        "p.m",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "z.b",
        "bzw",
        "usw",
        "ca",
        "dh",
        "d.h",
        "u.a",
        "s.o",
        "",
    }
)
# A line's structure before its text: indentation, list markers, heading hashes, quote marks.
_LEAD = re.compile(r"^(\s*(?:[-*+]\s+|\d+[.)]\s+|#{1,6}\s+|>\s*)*)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_TAG_OPEN = re.compile(r"<[^>]*$")
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)[^>]*?(/?)>")
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "wbr", "area", "col", "source"})


@dataclass(frozen=True, slots=True)
class Document:
    """A text as parts; ``sentences`` indexes the parts to translate, in order, and
    ``paragraphs`` says which paragraph each of them is in."""

    parts: tuple[str, ...]
    sentences: tuple[int, ...]
    paragraphs: tuple[int, ...]

    def texts(self) -> list[str]:
        return [self.parts[index] for index in self.sentences]

    def join(self, translations: list[str]) -> str:
        parts = list(self.parts)
        for index, translated in zip(self.sentences, translations, strict=True):
            parts[index] = translated
        return "".join(parts)


def split_document(text: str, max_chars: int = 1000) -> Document:
    """``text`` as glue and segments: each line's text whole, or, where it is longer than
    ``max_chars``, its sentences grouped up to ``max_chars`` (a longer sentence alone)."""
    parts: list[str] = []
    sentences: list[int] = []
    paragraphs: list[int] = []
    paragraph = 0
    fenced = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        if _FENCE.match(body):
            fenced = not fenced
            parts.append(line)
            continue
        if fenced or not body.strip():
            if not body.strip():
                paragraph += 1
            parts.append(line)
            continue
        lead = _LEAD.match(body)
        prefix = lead.group(1) if lead else ""
        if prefix:
            parts.append(prefix)
        rest = body[len(prefix) :]
        trailing = rest[len(rest.rstrip()) :]
        for piece, gap in _grouped(_sentences(rest.rstrip()), max_chars):
            sentences.append(len(parts))
            paragraphs.append(paragraph)
            parts.append(piece)
            if gap:
                parts.append(gap)
        parts.append(trailing + ending)
    return Document(tuple(parts), tuple(sentences), tuple(paragraphs))


def _grouped(sentences: list[tuple[str, str]], max_chars: int) -> list[tuple[str, str]]:
    """Consecutive sentences joined (with the spaces between them) while they fit."""
    groups: list[tuple[str, str]] = []
    for sentence, gap in sentences:
        if groups:
            text, before = groups[-1]
            if len(text) + len(before) + len(sentence) <= max_chars:
                groups[-1] = (text + before + sentence, gap)
                continue
        groups.append((sentence, gap))
    return groups


def _sentences(line: str) -> list[tuple[str, str]]:
    """The sentences of one line, each with the whitespace after it."""
    found: list[tuple[str, str]] = []
    start = 0
    for match in _END.finditer(line):
        end = match.end()
        candidate = line[start:end]
        if not candidate.strip() or not _ends_here(line, start, end):
            continue
        gap_end = end
        while gap_end < len(line) and line[gap_end].isspace():
            gap_end += 1
        if gap_end == len(line):
            break
        found.append((candidate, line[end:gap_end]))
        start = gap_end
    if start < len(line):
        found.append((line[start:], ""))
    return found


def _ends_here(line: str, start: int, end: int) -> bool:
    """Whether the punctuation before ``end`` ends a sentence."""
    before = line[start:end].rstrip("\"'»”’)]」』）")
    if _TAG_OPEN.search(line[:end]) or _open_elements(line[:end]):
        return False  # inside a tag, or inside an element: its tags stay in one sentence
    following = line[end:].lstrip()[:1]
    if following.islower():
        return False  # "item one. still one": a lower-case word goes on the same sentence
    if before.endswith("."):
        word = re.search(r"([\w.]+)\.$", before)
        if word:
            token = word.group(1).lower()
            if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                return False
    return True


def _open_elements(markup: str) -> int:
    """How many elements are open at the end of ``markup`` (void and self-closed ones aside)."""
    depth = 0
    for closing, name, selfclosed in _TAG.findall(markup):
        if selfclosed or name.lower() in _VOID:
            continue
        depth += -1 if closing else 1
    return max(depth, 0)
