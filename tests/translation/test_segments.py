"""Long texts: segmentation and reassembly keep a document's structure, in several scripts and
in Markdown; through HTTP a long text is translated segment by segment, and an edited document
generates again only the segment that changed."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.frontend.translation import segments
from service.frontend.translation.segments import split_document
from tests.conftest import ServiceClient, StartApp
from tests.fakes import FakeControl

CHINESE = "今天天气很好。我们去公园散步吧！你觉得怎么样？\n\n第二段开始了。它很短。\n"
JAPANESE = "東京は日本の首都です。人口はとても多いです。\n大阪も大きな都市です！\n"
ENGLISH = (
    'Dr. Smith arrived at 3.30 p.m. today. He said: "Hello!" Then he left.\n'
    "\n"
    "    An indented line. With two sentences.\n"
    "Was it e.g. a test? Yes.\n"
)
ARABIC = "مرحبا بكم في المدينة. كيف حالكم اليوم؟\n\nنحن بخير، شكرا.\n"
MARKDOWN = (
    "# Release notes\n"
    "\n"
    "This release adds streaming. It also fixes bugs.\n"
    "\n"
    "- Faster start. Less memory.\n"
    "- A new **page** for people.\n"
    "  1. nested item. still one.\n"
    "\n"
    "> A quote. Another one.\n"
    "\n"
    "```python\n"
    "print('not translated. ever.')\n"
    "```\n"
    '<p>See <a href="docs.html">the docs. Really</a>. Done.</p>\n'
)


def _structure(text: str) -> tuple[int, int, int, int, list[str]]:
    """Paragraphs, lines, list items, tags, and each line's leading structure."""
    lines = text.splitlines()
    lead = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+|#+\s+|>\s*)*")
    leads = [match.group(0) for line in lines if (match := lead.match(line)) is not None]
    return (
        len(re.split(r"\n\s*\n", text.strip())),
        len(lines),
        sum(1 for lead in leads if re.search(r"[-*+]|\d+[.)]", lead)),
        len(re.findall(r"<[^>]+>", text)),
        leads,
    )


@pytest.mark.parametrize("text", [CHINESE, JAPANESE, ENGLISH, ARABIC, MARKDOWN])
def test_translations_joined_keep_the_structure(text: str) -> None:
    document = split_document(text, max_chars=30)
    assert document.join(document.texts()) == text  # nothing lost, nothing added
    # A stand-in translation that changes every letter and keeps the markup inside a segment.
    translated = document.join([f"«{segment.swapcase()}»" for segment in document.texts()])
    assert _structure(translated)[:4] == _structure(text)[:4]
    assert _structure(translated)[4] == _structure(text)[4]


def test_sentences_split_where_they_end() -> None:
    texts = split_document(ENGLISH, max_chars=1).texts()
    assert texts == [
        "Dr. Smith arrived at 3.30 p.m. today.",
        'He said: "Hello!"',
        "Then he left.",
        "An indented line.",
        "With two sentences.",
        "Was it e.g. a test?",
        "Yes.",
    ]
    assert split_document(CHINESE, max_chars=1).texts()[:3] == [
        "今天天气很好。",
        "我们去公园散步吧！",
        "你觉得怎么样？",
    ]
    markdown = split_document(MARKDOWN, max_chars=1).texts()
    assert "print('not translated. ever.')" not in " ".join(markdown)  # code stays as written
    assert '<p>See <a href="docs.html">the docs. Really</a>. Done.</p>' in markdown  # one element
    assert "nested item. still one." in markdown  # no split before a lower-case word


# Clusters a cut must not break (a letter and its marks, an emoji sequence), words of several
# scripts (Thai has no sentence punctuation), spaces, clause and sentence marks, tags.
_PIECES = st.sampled_from(
    [
        "a", "word", "ก", "สวัสดี", "中", "文", "é", "e\u0301", "क्षि", "👍🏽", "👩\u200d💻",
        "❤\ufe0f", " ", "  ", ", ", "，", "、", "; ", ". ", "。", "။", "<b>", "</b>",
        "<a href='x y'>", "x" * 7,
    ]
)  # fmt: skip


def _starts_inside_a_cluster(text: str) -> bool:
    first = text[0]
    return (
        bool(unicodedata.combining(first))
        or unicodedata.category(first) in ("Mn", "Mc")
        or (first in "\u200d\ufe0f\U0001f3fd")
    )


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(_PIECES, max_size=120),
    lines=st.integers(1, 3),
    max_chars=st.integers(8, 40),
    hard=st.integers(0, 60),
    budget=st.integers(12, 80),
)
@example(words=["สวัสดี", " "] * 60, lines=1, max_chars=30, hard=0, budget=80)  # a Thai paragraph
@example(words=["x" * 7] * 40, lines=1, max_chars=10, hard=0, budget=80)  # no space at all
def test_a_sentence_no_segment_may_hold_is_cut_into_segments_that_may(
    words: list[str], lines: int, max_chars: int, hard: int, budget: int
) -> None:
    text = "\n".join("".join(words[i::lines]) for i in range(lines))
    hard_chars = max_chars + hard

    def fits(piece: str) -> bool:  # bytes standing in for tokens: a dense script has more
        return len(piece.encode()) <= budget

    document = split_document(text, max_chars, hard_chars, fits)
    assert document.join(document.texts()) == text  # nothing lost, nothing added
    for segment in document.texts():
        assert len(segment) <= hard_chars
        assert fits(segment), segment
        assert not _starts_inside_a_cluster(segment), segment
        assert segment == segment.strip()


def test_pieces_shortened_for_a_dense_stretch_grow_again_after_it() -> None:
    # Bytes stand in for tokens: two-byte letters first, then a plain run of words.
    text = "é" * 40 + " ab" * 100

    def fits(piece: str) -> bool:
        return len(piece.encode()) <= 30

    pieces = split_document(text, 30, 30, fits).texts()
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    plain = [piece for piece in pieces if "é" not in piece]
    assert all(len(piece) >= 26 for piece in plain[:-1]), plain  # not cut to the dense size


def test_a_lines_tags_are_read_once_however_many_sentences_end_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each sentence end used to read the line before it again for open tags and elements: a
    # 52,000-character line of short sentences and tags took seconds of a worker.
    reads: list[str] = []
    tag = segments._TAG

    class Counted:
        def __getattr__(self, name: str) -> object:
            reads.append(name)
            return getattr(tag, name)

    monkeypatch.setattr(segments, "_TAG", Counted())
    line = "Ab. <b>x</b> " * 200
    assert len(split_document(line, 30).texts()) == 100  # 400 sentence ends
    assert len(reads) == 1


def test_a_sentence_end_reads_only_the_characters_before_it_that_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "A. B. C. ..." never ends a sentence (single capitals), so each end read the whole run
    # before it again: a 48,000-character line took 16 s of a worker.
    searched: list[int] = []
    search = re.search

    def counted(pattern: str, text: str) -> re.Match[str] | None:
        searched.append(len(text))
        return search(pattern, text)

    monkeypatch.setattr(re, "search", counted)
    line = "A. " * 2000
    assert split_document(line, 1000).join(split_document(line, 1000).texts()) == line
    assert len(searched) > 1000
    assert max(searched) <= segments._TAIL


def test_a_line_of_sentence_ends_that_end_nothing_is_read_in_linear_time() -> None:
    # Each end of "A. B. C. ..." copied the unended run before it and the rest of the line after
    # it: quadratic in the line (over a second of a worker for 48,000 characters).
    copied: list[int] = []

    class Counted(str):
        def __getitem__(self, key: Any) -> str:
            piece = str.__getitem__(self, key)
            copied.append(len(piece))
            return piece

    line = "A. " * 4000
    found = segments._sentences(Counted(line))
    assert "".join(sentence + gap for sentence, gap in found) == line
    assert sum(copied) < 40 * len(line)  # each end reads the few characters before it


async def test_a_long_text_is_translated_by_segment_and_cached_by_segment(
    start_app: StartApp, fake: FakeControl
) -> None:
    client: ServiceClient = await start_app(loader=fake.loader(), max_text_chars=80)
    paragraphs = [f"Paragraph {n} has a first sentence. And a second one here." for n in range(6)]
    text = "\n\n".join(paragraphs) + "\n"
    warmed = fake.items_seen  # the warm-up's generations
    first = await client.http.post("/translate", json={"text": text, "target_lang": "de"})
    assert first.status_code == 200, first.text
    answer = first.json()["translation"]
    assert answer.count("\n\n") == 5  # the paragraphs, joined as they were
    assert answer.endswith("\n")
    generated = fake.items_seen
    assert generated - warmed == 6  # one segment per paragraph (each line fits in 80 characters)
    paragraphs[3] = "Paragraph 3 now says something else entirely."
    edited = "\n\n".join(paragraphs) + "\n"
    again = await client.http.post("/translate", json={"text": edited, "target_lang": "de"})
    assert again.status_code == 200, again.text
    assert fake.items_seen == generated + 1  # only the changed paragraph
    too_long = await client.http.post(
        "/translate", json={"text": "x " * 30_000, "target_lang": "de"}
    )
    assert too_long.status_code == 422
    assert "for a document" in too_long.json()["error"]["message"]


async def test_a_long_text_that_opens_with_blank_lines_is_translated(
    start_app: StartApp, fake: FakeControl
) -> None:
    # Found by a probe: 49,000 newlines and then a word were refused as "the text is empty",
    # because only the first max_text_chars characters were looked at.
    client: ServiceClient = await start_app(loader=fake.loader(), max_text_chars=80)
    text = "\n" * 500 + "Hello there. This is the only line."
    answer = await client.http.post("/translate", json={"text": text, "target_lang": "de"})
    assert answer.status_code == 200, answer.text
    translation = answer.json()["translation"]
    assert translation.startswith("\n" * 500)
    assert translation.strip()
    blank = await client.http.post("/translate", json={"text": "\n" * 500, "target_lang": "de"})
    assert blank.status_code == 422
    assert "empty" in blank.json()["error"]["message"]


async def test_a_text_of_more_segments_than_the_queue_holds_is_too_large_not_a_429(
    start_app: StartApp, fake: FakeControl
) -> None:
    # Found by a probe: "a\n" 24,000 times (24,000 one-line segments, a queue of 4,096) got a
    # 429 "0 texts in flight, at most 4096", which a client retries unchanged for ever.
    client: ServiceClient = await start_app(
        loader=fake.loader(), max_text_chars=80, max_queue_size=50
    )
    text = "A line.\n" * 60
    answer = await client.http.post("/translate", json={"text": text, "target_lang": "de"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "batch_too_large"
    assert "60 segments, more than the 50" in answer.json()["error"]["message"]
    assert "retry-after" not in answer.headers
    fits = await client.http.post(
        "/translate", json={"text": "A line.\n" * 40, "target_lang": "de"}
    )
    assert fits.status_code == 200, fits.text


async def test_a_long_text_streams_segment_by_segment_in_document_order(
    start_app: StartApp, fake: FakeControl
) -> None:
    client: ServiceClient = await start_app(loader=fake.loader(), max_text_chars=80)
    text = "# Notes\n\n" + "\n".join(
        f"- Item {n} has a first sentence. And a second one here." for n in range(5)
    )
    body = {"text": text, "target_lang": "de", "source_lang": "en"}
    async with client.http.stream("POST", "/translate/stream", json=body) as response:
        assert response.status_code == 200
        events = [
            (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("data: ")[1]))
            for block in (await response.aread()).decode().strip().split("\n\n")
        ]
    names = [name for name, _ in events]
    assert names[-1] == "done"
    assert names.count("piece") >= 6  # the heading, the items and the glue between them
    streamed = "".join(data["text"] for name, data in events if name == "piece")
    done = events[-1][1]
    assert streamed == done["translation"]
    whole = await client.http.post("/translate", json=body)
    assert whole.json()["translation"] == streamed  # the same text as the whole answer
    assert streamed.count("\n- ") == 5
    assert done["usage"]["output_tokens"] > 0
