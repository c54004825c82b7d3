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
from collections import defaultdict
from dataclasses import dataclass

from service.frontend.translation.markup import TAG, VOID, split_tags

_NUMBERED = re.compile(r"<(/)?s(\d+)\s*>")
_TARGET = re.compile(r"<target>(.*?)(?:</target>|$)", re.S)


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
    parts = split_tags(markup)
    out: list[str] = []
    tags: list[list[str]] = []
    # Numbers of the elements open now, with their names, innermost last; and where in it each
    # name is open (a closing tag finds its element without reading the whole of it).
    open_now: list[tuple[str, int]] = []
    open_at: defaultdict[str, list[int]] = defaultdict(list)
    for index, part in enumerate(parts):
        tag = TAG.fullmatch(part) if index % 2 else None
        if tag is None:
            out.append(part)
            continue
        closing, name, rest = bool(tag.group(1)), tag.group(2).lower(), tag.group(3)
        if closing:
            if not open_at[name]:
                out.append(part)  # a closing tag without its opening one: left as written
                continue
            position = open_at[name][-1]
            for inner, number in reversed(open_now[position:]):
                out.append(f"</s{number}>")
                open_at[inner].pop()
            tags[open_now[position][1] - 1][1] = part
            del open_now[position:]
            continue
        tags.append([part, ""])
        number = len(tags)
        out.append(f"<s{number}>")
        if rest.rstrip().endswith("/") or name in VOID:
            out.append(f"</s{number}>")
        else:
            open_at[name].append(len(open_now))
            open_now.append((name, number))
    for _, number in reversed(open_now):  # elements never closed: closed at the end
        out.append(f"</s{number}>")
    return Numbered("".join(out), tuple((opening, closing) for opening, closing in tags))
