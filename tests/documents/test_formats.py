"""Each file format parsed into units and rebuilt: the structure comes back as it was (lines,
cues and timing lines, tags, paragraphs and their formatting runs), and files of other types
or broken ones are refused as client errors."""

from __future__ import annotations

import contextlib
import io
import zipfile

import docx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract.errors import InvalidInput, PayloadTooLarge, Unsupported
from service.frontend.documents.formats import format_of, parse

SRT = (
    "1\n00:00:01,000 --> 00:00:02,500\nHello there.\nSecond line.\n\n"
    "2\n00:00:03,000 --> 00:00:04,000\n<i>Goodbye.</i>\n\n"
    "3\n00:00:05,000 --> 00:00:06,000\n♪\n"
)
VTT = (
    "WEBVTT - a title\n\nNOTE a comment that stays\n\nSTYLE\n::cue { color: red }\n\n"
    "intro\n00:01.000 --> 00:02.000 align:start\nWelcome back.\n\n"
    "00:03.000 --> 00:04.000\nSee you.\n"
)
MARKDOWN = "# Title\n\nFirst paragraph. Two sentences.\n- one\n- two\n\n\n> quoted\n"


def test_subtitles_keep_numbers_timing_and_blocks() -> None:
    parsed = parse(SRT.encode(), "srt", 1000)
    assert [unit.text for unit in parsed.units] == [
        "Hello there.\nSecond line.",
        "<i>Goodbye.</i>",
    ]  # the music note has no words: kept as it is
    assert [unit.kind for unit in parsed.units] == ["text", "markup"]  # tags kept in place
    rebuilt = parsed.rebuild(["HELLO THERE.\nSECOND LINE.", "<i>Goodbye.</i>"]).decode()
    assert rebuilt == SRT.replace("Hello there.\nSecond line.", "HELLO THERE.\nSECOND LINE.")
    assert rebuilt.count("-->") == 3
    vtt = parse(VTT.encode(), "vtt", 1000)
    assert [unit.text for unit in vtt.units] == ["Welcome back.", "See you."]
    out = vtt.rebuild(["Willkommen zurück.", "Bis bald."]).decode()
    assert out.startswith("WEBVTT - a title\n\nNOTE a comment that stays\n\nSTYLE\n")
    assert "intro\n00:01.000 --> 00:02.000 align:start\nWillkommen zurück.\n" in out
    with pytest.raises(InvalidInput, match="WEBVTT"):
        parse(b"00:01.000 --> 00:02.000\nHi\n", "vtt", 1000)


def test_text_and_markdown_in_chunks_cut_at_line_breaks() -> None:
    parsed = parse(("\ufeff" + MARKDOWN).encode(), "md", 40)
    texts = [unit.text for unit in parsed.units]
    assert texts == ["# Title\n\nFirst paragraph. Two sentences.", "- one\n- two\n\n\n> quoted"]
    assert all(unit.kind == "document" for unit in parsed.units)
    # Identity translations give the file back byte for byte, BOM and blank lines included.
    assert parsed.rebuild(texts) == ("\ufeff" + MARKDOWN).encode()
    whole = parse(MARKDOWN.encode(), "md", 10_000)
    assert len(whole.units) == 1
    # A long file without paragraph breaks, and a line longer than a chunk.
    lines = "".join(f"Line {n} of a long file.\n" for n in range(2000))
    long_line = "word " * 3000
    for text in (lines, long_line, "\n\n  lead and trail  \n\n"):
        chunked = parse(text.encode(), "txt", 1000)
        assert all(len(unit.text) <= 1000 for unit in chunked.units)
        assert chunked.rebuild([unit.text for unit in chunked.units]) == text.encode()
    with pytest.raises(InvalidInput, match="UTF-8"):
        parse("é".encode("latin-1"), "txt", 1000)


def test_html_is_one_markup_unit() -> None:
    page = "<html><body><p>Hello <b>world</b>.</p></body></html>"
    parsed = parse(page.encode(), "html", 1000)
    (unit,) = parsed.units
    assert unit.kind == "markup"
    assert "b" in unit.inline
    assert parsed.rebuild(["<p>x</p>"]) == b"<p>x</p>"


def _word_file() -> bytes:
    document = docx.Document()
    paragraph = document.add_paragraph("Hello ")
    paragraph.add_run("bold").bold = True
    paragraph.add_run(" & <world>.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "Cell A"
    table.cell(0, 1).text = "Cell B"
    document.sections[0].header.paragraphs[0].text = "Header text"
    document.add_paragraph("")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_word_paragraphs_keep_their_runs() -> None:
    parsed = parse(_word_file(), "docx", 1000)
    texts = [unit.text for unit in parsed.units]
    assert texts == [
        "<r0>Hello </r0><r1>bold</r1><r2> &amp; &lt;world&gt;.</r2>",
        "<r0>Cell A</r0>",
        "<r0>Cell B</r0>",
        "<r0>Header text</r0>",
    ]
    rebuilt = parsed.rebuild(
        [
            # The model moved a word outside the runs: it joins the run before it.
            "<r0>Hallo </r0><r1>fett</r1> und<r2> &amp; &lt;Welt&gt;.</r2>",
            "<r0>Zelle A</r0>",
            "Zelle B",  # no tags at all: all of it in the first run
            "<r0>Kopfzeile</r0>",
        ]
    )
    document = docx.Document(io.BytesIO(rebuilt))
    runs = [(run.text, run.bold) for run in document.paragraphs[0].runs]
    assert runs == [("Hallo ", None), ("fett und", True), (" & <Welt>.", None)]
    assert [cell.text for cell in document.tables[0].rows[0].cells] == ["Zelle A", "Zelle B"]
    assert document.sections[0].header.paragraphs[0].text == "Kopfzeile"
    assert len(document.paragraphs) == 2  # the empty paragraph stays


def test_other_types_and_broken_files_are_client_errors() -> None:
    assert format_of("Report.DOCX") == "docx"
    assert format_of("subs.en.srt") == "srt"
    with pytest.raises(Unsupported, match=r"\.pdf"):
        format_of("paper.pdf")
    with pytest.raises(Unsupported):
        format_of("README")
    with pytest.raises(InvalidInput, match="not a Word"):
        parse(b"PK\x03\x04 not really a zip", "docx", 1000)
    with pytest.raises(InvalidInput, match="not a Word"):
        parse(b"plain text", "docx", 1000)


def _package(parts: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        for name, data in parts.items():
            package.writestr(name, data)
    return out.getvalue()


def _word_parts() -> dict[str, bytes]:
    document = docx.Document()
    document.add_paragraph("Hello there.")
    out = io.BytesIO()
    document.save(out)
    with zipfile.ZipFile(io.BytesIO(out.getvalue())) as package:
        return {name: package.read(name) for name in package.namelist()}


WORD_PARTS = _word_parts()
# What a broken or hostile part holds: bytes, XML without the namespaces python-docx expects,
# elements it reads as others (a content-types part of the wrong shape), entity declarations.
PART_CONTENTS = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"<Types/>",
            b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            b"<Override/></Types>",
            b"<Relationships/>",
            b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]>'
            b"<d>&b;</d>",
            b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
            b"<w:body><w:p><w:r><w:t/></w:r><w:p/></w:p></w:body></w:document>",
        ]
    ),
)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(WORD_PARTS)), st.one_of(st.none(), PART_CONTENTS), max_size=3
    )
)
def test_a_broken_word_package_is_refused_as_the_client_s_error(
    changes: dict[str, bytes | None],
) -> None:
    # Parts of a real .docx replaced or left out: parsed, or refused as a client error (an
    # AttributeError from a content-types part without its namespace was a 500).
    parts = {name: data for name, data in WORD_PARTS.items() if changes.get(name, data) is not None}
    parts.update({name: data for name, data in changes.items() if data is not None})
    with contextlib.suppress(InvalidInput, PayloadTooLarge):
        parse(_package(parts), "docx", 1000)
