"""Markup read at its tags: what a text of any shape splits into, and that reading it takes time
in proportion to its length whatever a client puts in it (tags that never close, thousands of
open elements, a tag of spaces): each of those shapes once held an API process's event loop for
seconds to minutes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.frontend.translation.markup import INLINE, segment, split_tags, tag_sequence
from service.frontend.translation.segments import split_document
from service.frontend.translation.tags import number_tags

# What split_tags must split like (and was, until it proved quadratic).
_ORACLE = re.compile(r"(<!--.*?-->|<[^>]*>)", re.S)

_ATOMS = st.sampled_from(
    [
        *("<b>", "</b>", "<i>", "</i>", "<p>", "</p>", "<br>", "<img/>", "<span>", "</x>"),
        *("<!--", "-->", "<!-- c -->", "<", ">", "a", "x y", " ", "\n", "é"),
        *("<script>", "</script>", "< / b >", "<b  >", "<x translate='no'>"),
    ]
)
_MARKUP = st.lists(_ATOMS, max_size=40).map("".join)


@given(_MARKUP)
def test_markup_splits_into_text_and_tags_like_the_expression(markup: str) -> None:
    parts = split_tags(markup)
    assert parts == _ORACLE.split(markup)
    assert "".join(parts) == markup


@given(_MARKUP, st.sampled_from([(), ("x",), ("b",)]), st.sampled_from([(), INLINE]))
def test_a_segmented_text_rebuilds_as_written(
    markup: str, ignore: tuple[str, ...], inline: frozenset[str]
) -> None:
    split = segment(markup, ignore, inline)
    assert split.rebuild([split.parts[i].strip() for i in split.texts]) == markup
    assert all(split.parts[i].strip() for i in split.texts)


def test_a_sentence_through_inline_elements_is_one_text() -> None:
    split = segment("<p>Hello <b>big</b> world</p><i>", inline=INLINE)
    assert [split.parts[i] for i in split.texts] == ["Hello <b>big</b> world"]
    # An unbalanced head stays split; the balanced tail from "b" on is one text.
    split = segment("x</i>a <b>b</b> c", inline=INLINE)
    assert [split.parts[i] for i in split.texts] == ["x", "a <b>b</b> c"]
    assert tag_sequence("a <b>b</b><!-- <i> --> c") == [(False, "b"), (True, "b")]


def _cpu_seconds(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


_SHAPES: dict[str, Callable[[int], str]] = {
    "comments that never close": lambda n: "<!--" * (n // 4),
    "less-than signs": lambda n: "<" * n,
    "tags that never close": lambda n: "<b" * (n // 2),
    "comment-like tags": lambda n: "<!--a>" * (n // 6),
    "empty inline elements": lambda n: "<i></i>" * (n // 7),
    "opened, closed as another": lambda n: "<b>" * (n // 7) + "</i>" * (n // 7),
    "kept, then closed as another": lambda n: "<script>" + "<b>" * (n // 7) + "</i>" * (n // 7),
    "a tag of spaces": lambda n: "<" + " " * n + ">",
    "nested inline elements": lambda n: "<b>" * (n // 8) + "x" + "</b>" * (n // 8),
}
_READERS: dict[str, Callable[[str], object]] = {
    "segment": lambda text: segment(text, (), INLINE),
    "number_tags": number_tags,
    "split_document": lambda text: split_document(text, 2000, 5000, lambda _: True),
}


@pytest.mark.parametrize("reader", list(_READERS))
@pytest.mark.parametrize("shape", list(_SHAPES))
def test_markup_of_any_shape_is_read_in_linear_time(shape: str, reader: str) -> None:
    # Sixteen times the text: sixteen times the work when linear, 256 times when quadratic.
    # CPU time of this process alone, the best of three, so other processes do not count.
    make, read = _SHAPES[shape], _READERS[reader]
    small, large = make(2_000), make(32_000)
    ratio = _cpu_seconds(lambda: read(large)) / max(_cpu_seconds(lambda: read(small)), 1e-5)
    assert ratio < 64, f"{ratio:.0f} times the time for 16 times the text"
