"""Long texts cut into segments to translate one by one, and put back together.

A document is split into parts that are either *glue*, kept exactly as written (line breaks,
blank lines, indentation, Markdown list markers, heading hashes and quote marks, fenced code
blocks, the spaces between segments) or *segments* to translate: a line's text, or, for a long
line, runs of its sentences up to a size. Sentences end at ``. ! ?`` and their Arabic,
Devanagari and fullwidth forms followed by a space, and at the CJK full stop, exclamation and
question marks and the Burmese, Khmer and Tibetan ends without one; not after a known
abbreviation or a single capital (``e.g.``, ``Dr.``, ``J. Smith``), not before a lower-case
word, not inside a number (``3.14``), and not inside a tag or an element
(``<a href="x.html">...</a>`` stays in one segment). Joining the translations with the glue
gives back the document's structure: the same paragraphs, lines, list items and tags.

A sentence no segment may hold (over the hard limit in characters, or more tokens than a text
may have: a Thai paragraph, which has no sentence punctuation, or an unpunctuated transcript) is
cut further, near the segment size: after clause punctuation, else at a space, else between
two characters (never inside a combining sequence or an emoji's joined parts), so that a
document is refused only for its total size.

Each segment is its own cache entry, so an edited document generates again only the segments
that changed.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from service.frontend.translation.markup import VOID

# Ends of sentences: Latin and Arabic punctuation (then whitespace), CJK full stops (none needed).
_END = re.compile(r"(?<=[.!?؟۔।])[\"'»”’)\]]*(?=\s)|(?<=[。！？။។៕།༎])[」』”’）]*")
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
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)[^>]*?(/?)>")
# Where an over-long sentence is cut, best first: after clause punctuation, then at a space.
_CLAUSE = re.compile(r"(?<=[,;:，；：、،؛])\s*")
_SPACE = re.compile(r"\s+")
# Characters that belong to the one before them (joiners, variation selectors, skin tones, tag
# characters): no cut goes before one, nor after a zero-width joiner.
_JOINED = re.compile(
    r"[\u200c\u200d\ufe00-\ufe0f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f\U000e0100-\U000e01ef]"
)

# Any character but whitespace; the first one after a sentence end (none at the line's end).
_TEXT = re.compile(r"\S")
_FOLLOWING = re.compile(r"\s*(.?)", re.DOTALL)
# Characters before a sentence end that decide whether it is one (an abbreviation, quotes).
_TAIL = 64
# Longer than any emoji sequence: a longer run of marks is cut anywhere.
_LONGEST_CLUSTER = 32

Fits = Callable[[str], bool]


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


def split_document(
    text: str, max_chars: int = 1000, hard_chars: int | None = None, fits: Fits | None = None
) -> Document:
    """``text`` as glue and segments: each line's text whole, or, where it is longer than
    ``max_chars``, its sentences grouped up to ``max_chars`` (a longer sentence alone). A
    sentence over ``hard_chars``, or one ``fits`` says no to (too many tokens), is cut into
    pieces of up to ``max_chars`` that ``fits``; groups are joined only where ``fits``."""
    ok = fits or _always
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
        found = _sentences(rest.rstrip())
        if hard_chars is not None or fits is not None:
            limit = hard_chars if hard_chars is not None else len(rest)
            found = [cut for found_one in found for cut in _cut(*found_one, limit, max_chars, ok)]
        for piece, gap in _grouped(found, max_chars, ok):
            sentences.append(len(parts))
            paragraphs.append(paragraph)
            parts.append(piece)
            if gap:
                parts.append(gap)
        parts.append(trailing + ending)
    return Document(tuple(parts), tuple(sentences), tuple(paragraphs))


def _always(text: str) -> bool:
    return True


def _grouped(
    sentences: list[tuple[str, str]], max_chars: int, fits: Fits = _always
) -> list[tuple[str, str]]:
    """Consecutive sentences joined (with the spaces between them) while they fit: up to
    ``max_chars``, and a group ``fits`` says no to cut into the longest runs it says yes to
    (a few calls a group, not one a sentence: thousands of short sentences on a line)."""
    groups: list[tuple[str, str]] = []
    for group in _runs(sentences, max_chars):
        if len(group) == 1 or fits(_joined(group)):
            groups.append((_joined(group), group[-1][1]))
            continue
        while group:  # the longest run that fits, by halves (a prefix fits if a longer one does)
            low, high = 1, len(group)
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if fits(_joined(group[:middle])) else (low, middle - 1)
            groups.append((_joined(group[:low]), group[low - 1][1]))
            group = group[low:]
    return groups


def _runs(sentences: list[tuple[str, str]], max_chars: int) -> list[list[tuple[str, str]]]:
    """``sentences`` in runs of at most ``max_chars`` (their gaps between), each as long as it
    may be."""
    runs: list[list[tuple[str, str]]] = []
    size = 0
    for sentence, gap in sentences:
        if runs:
            joined = size + len(runs[-1][-1][1]) + len(sentence)
            if joined <= max_chars:
                runs[-1].append((sentence, gap))
                size = joined
                continue
        runs.append([(sentence, gap)])
        size = len(sentence)
    return runs


def _joined(run: list[tuple[str, str]]) -> str:
    """A run's sentences with the gaps between them (not the last one's)."""
    return "".join(sentence + gap for sentence, gap in run[:-1]) + run[-1][0]


def _cut(
    sentence: str, gap: str, hard_chars: int, max_chars: int, fits: Fits
) -> list[tuple[str, str]]:
    """``sentence`` (with ``gap`` after it) whole where it is at most ``hard_chars`` and
    ``fits``, else as pieces of up to ``max_chars`` that ``fits`` (fewer characters while one
    does not: a dense script's tokens), each with the whitespace after it."""
    if len(sentence) <= hard_chars and fits(sentence):
        return [(sentence, gap)]
    pieces: list[tuple[str, str]] = []
    widest = max(1, min(max_chars, hard_chars))
    rest, limit = sentence, widest
    while len(rest) > widest or not fits(rest):
        end = _break(rest, min(limit, len(rest) - 1)) if len(rest) > 1 else 1
        piece = rest[:end].rstrip() or rest[:end]  # (a piece of spaces only: still progress)
        if limit > 1 and not fits(piece):
            limit = max(1, min(limit, len(piece)) // 2)  # too many tokens: shorter pieces
            continue
        after = rest[len(piece) :]
        following = after.lstrip()
        pieces.append((piece, after[: len(after) - len(following)]))
        rest = following
        if not rest or (limit == 1 and not fits(piece)):
            break  # nothing left, or one character over the tokens: the text's check says so
        limit = min(widest, 2 * limit)  # a dense stretch over: longer pieces again
    if rest:
        pieces.append((rest, gap))
    else:
        pieces[-1] = (pieces[-1][0], pieces[-1][1] + gap)
    return pieces


def _break(text: str, limit: int) -> int:
    """Where to end a piece of ``text`` of at most ``limit`` characters (``0 < limit <
    len(text)``): after the last clause punctuation in its second half, else at the last space
    in its last three quarters, else at ``limit`` moved back off a combining sequence (or on
    past it, where it began the piece); never inside a tag."""
    window = text[: limit + 1]
    for pattern, start in ((_CLAUSE, limit // 2), (_SPACE, limit // 4)):
        ends = [
            m.start()
            for m in pattern.finditer(window, start)
            if 0 < m.start() <= limit and _outside_tags(text, m.start())
        ]
        if ends:
            return ends[-1]
    end = limit
    while end > 0 and _inside_cluster(text, end):
        end -= 1
    if end > 0:
        return end
    end = limit  # a cluster from the start on (a piece of one character): after it instead,
    while end < min(len(text), limit + _LONGEST_CLUSTER) and _inside_cluster(text, end):
        end += 1
    return end if not _inside_cluster(text, end) else limit  # or marks without end: anywhere


def _inside_cluster(text: str, end: int) -> bool:
    """Whether cutting ``text`` before ``end`` would part a character from its marks or
    joined parts."""
    return end < len(text) and (_belongs(text[end]) or text[end - 1] == "\u200d")


def _outside_tags(text: str, end: int) -> bool:
    """Whether ``text[:end]`` has no tag left open (a ``<`` after its last ``>``)."""
    return text.rfind("<", 0, end) <= text.rfind(">", 0, end)


def _belongs(char: str) -> bool:
    """Whether ``char`` goes with the character before it (a combining mark, a joiner, a
    variation selector, a skin tone)."""
    return (
        bool(unicodedata.combining(char))
        or unicodedata.category(char) in ("Mn", "Me", "Mc")
        or bool(_JOINED.match(char))
    )


def _sentences(line: str) -> list[tuple[str, str]]:
    """The sentences of one line, each with the whitespace after it."""
    found: list[tuple[str, str]] = []
    start = 0
    tags = _Tags(line)
    for match in _END.finditer(line):
        end = match.end()
        # (searched, not sliced: an unended run would be copied again at every end)
        if not _TEXT.search(line, start, end) or not _ends_here(line, start, end, tags):
            continue
        gap_end = end
        while gap_end < len(line) and line[gap_end].isspace():
            gap_end += 1
        if gap_end == len(line):
            break
        found.append((line[start:end], line[end:gap_end]))
        start = gap_end
    if start < len(line):
        found.append((line[start:], ""))
    return found


def _ends_here(line: str, start: int, end: int, tags: _Tags) -> bool:
    """Whether the punctuation before ``end`` ends a sentence."""
    # Its last characters only: a run of "A. B. C." that never ends a sentence made each end
    # read the whole run again, quadratic in a long line.
    before = line[max(start, end - _TAIL) : end].rstrip("\"'»”’)]」』）")
    if tags.inside_tag(end) or tags.open_elements(end):
        return False  # inside a tag, or inside an element: its tags stay in one sentence
    after = _FOLLOWING.match(line, end)
    following = after.group(1) if after else ""
    if following.islower():
        return False  # "item one. still one": a lower-case word goes on the same sentence
    if before.endswith("."):
        word = re.search(r"([\w.]+)\.$", before)
        if word:
            token = word.group(1).lower()
            if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                return False
    return True


class _Tags:
    """A line's tags, read once, so that each sentence end asks about the text before it
    without reading that text again (a line of thousands of sentences and tags)."""

    def __init__(self, line: str) -> None:
        self._opens = [i for i, char in enumerate(line) if char == "<"]
        self._closes = [i for i, char in enumerate(line) if char == ">"]
        self._ends: list[int] = []
        self._depths: list[int] = []
        depth = 0
        # Searched only up to the last ">": from a "<" with none after it the search reads the
        # rest of the line, and thousands of such "<" made it quadratic.
        for match in _TAG.finditer(line, 0, line.rfind(">") + 1):
            closing, name, selfclosed = match.groups()
            if selfclosed or name.lower() in VOID:
                continue
            depth += -1 if closing else 1
            self._ends.append(match.end())
            self._depths.append(depth)

    def inside_tag(self, end: int) -> bool:
        """Whether ``line[:end]`` ends inside a tag: a ``<`` after its last ``>``."""
        last_open = bisect_left(self._opens, end) - 1
        last_close = bisect_left(self._closes, end) - 1
        return last_open >= 0 and (
            last_close < 0 or self._opens[last_open] > self._closes[last_close]
        )

    def open_elements(self, end: int) -> int:
        """How many elements are open at the end of ``line[:end]`` (void and self-closed ones
        aside; a closing tag with none open counted against the ones after it, as written)."""
        index = bisect_right(self._ends, end) - 1
        return max(self._depths[index], 0) if index >= 0 else 0
