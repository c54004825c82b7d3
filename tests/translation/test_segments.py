"""Long texts: segmentation and reassembly keep a document's structure, in several scripts and
in Markdown; through HTTP a long text is translated segment by segment, and an edited document
generates again only the segment that changed."""

from __future__ import annotations

import json
import re

import pytest

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
