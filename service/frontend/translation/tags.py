"""Numbered tags for HY-MT1.5's formatted translation, and back.

The template asks the model to keep ``<sN></sN>`` tags where the formatting goes and to answer
inside ``<target></target>``. ``number_tags`` replaces each element of the markup by a numbered
pair in the order the elements open (nested ones included: ``<b>a <i>b</i></b>`` becomes
``<s1>a <s2>b</s2></s1>``; an element without a closing tag, such as ``<br>``, becomes an empty
pair), and ``restore`` puts the original tags back in the model's answer wherever it kept the
numbered ones. Comments stay as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKENS = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)
_TAG = re.compile(r"<\s*(/)?\s*([A-Za-z][\w:.-]*)([^>]*)>", re.S)
_NUMBERED = re.compile(r"<(/)?s(\d+)\s*>")
_TARGET = re.compile(r"<target>(.*?)(?:</target>|$)", re.S)
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


@dataclass(frozen=True, slots=True)
class Numbered:
    """The markup with numbered tags, and each number's original opening and closing tag."""

    numbered: str
    tags: tuple[tuple[str, str], ...]

    def restore(self, answer: str) -> str:
        """The model's answer with its numbered tags turned back into the original ones
        (numbers the markup did not have stay as the model wrote them)."""
        found = _TARGET.search(answer)
        inner = found.group(1) if found else answer

        def original(match: re.Match[str]) -> str:
            index = int(match.group(2)) - 1
            if not 0 <= index < len(self.tags):
                return match.group(0)
            opening, closing = self.tags[index]
            return closing if match.group(1) else opening

        return _NUMBERED.sub(original, inner.strip())


def number_tags(markup: str) -> Numbered:
    """``markup`` with every element numbered ``<s1>``, ``<s2>``... in the order they open."""
    parts = _TOKENS.split(markup)
    out: list[str] = []
    tags: list[list[str]] = []
    # Numbers of the elements open now, with their names, innermost last.
    open_now: list[tuple[str, int]] = []
    for index, part in enumerate(parts):
        tag = _TAG.fullmatch(part) if index % 2 else None
        if tag is None:
            out.append(part)
            continue
        closing, name, rest = bool(tag.group(1)), tag.group(2).lower(), tag.group(3)
        if closing:
            position = next(
                (i for i in range(len(open_now) - 1, -1, -1) if open_now[i][0] == name), None
            )
            if position is None:
                out.append(part)  # a closing tag without its opening one: left as written
                continue
            for _, number in reversed(open_now[position:]):
                out.append(f"</s{number}>")
            tags[open_now[position][1] - 1][1] = part
            del open_now[position:]
            continue
        tags.append([part, ""])
        number = len(tags)
        out.append(f"<s{number}>")
        if rest.rstrip().endswith("/") or name in _VOID:
            out.append(f"</s{number}>")
        else:
            open_now.append((name, number))
    for _, number in reversed(open_now):  # elements never closed: closed at the end
        out.append(f"</s{number}>")
    return Numbered("".join(out), tuple((opening, closing) for opening, closing in tags))
