"""Documents are read in a child process of their own, under a memory cap and a deadline, a few
at a time: a file built to cost gigabytes or minutes to read costs the API process nothing."""

from __future__ import annotations

import asyncio
import io
import sys
import time
from functools import cache
from pathlib import Path

import docx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.heavy_document import heavy_word_file
from service.contract.errors import InvalidInput, Overloaded, PayloadTooLarge
from service.frontend.documents import formats, reading
from service.frontend.documents.formats import FileFormat
from service.frontend.documents.reading import DocumentReader, Read, ReadingConfig
from tests.conftest import MakeSettings, own_data, started
from tests.fakes import FakeControl


@cache
def many_paragraphs() -> bytes:
    """250,000 one-letter paragraphs, stored (9.3 MB): python-docx reads them in seconds and
    hundreds of MB."""
    return heavy_word_file()


_LINES = st.lists(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=30), min_size=1, max_size=8
)


@settings(max_examples=8, deadline=None)
@given(lines=_LINES, file_format=st.sampled_from(["txt", "md"]))
def test_a_child_reads_and_rebuilds_what_the_parser_does_in_process(
    lines: list[str], file_format: formats.FileFormat
) -> None:
    data = "\n\n".join(lines).encode()
    try:
        expected = formats.parse(data, file_format, 1000)
    except InvalidInput:
        with pytest.raises(InvalidInput):
            asyncio.run(DocumentReader().units(data, file_format))
        return
    reader = DocumentReader()
    read = asyncio.run(reader.units(data, file_format))
    assert read.units == expected.units
    assert read.characters == expected.characters
    translations = [unit.text.upper() for unit in read.units]
    rebuilt = asyncio.run(reader.rebuilt(data, file_format, translations))
    assert rebuilt == expected.rebuild(translations)


async def test_a_word_file_keeps_its_runs_through_the_child() -> None:
    document = docx.Document()
    paragraph = document.add_paragraph("Hello ")
    paragraph.add_run("bold").bold = True
    out = io.BytesIO()
    document.save(out)
    reader = DocumentReader()
    read = await reader.units(out.getvalue(), "docx")
    assert [unit.text for unit in read.units] == ["<r0>Hello </r0><r1>bold</r1>"]
    rebuilt = await reader.rebuilt(out.getvalue(), "docx", ["<r0>Hallo </r0><r1>fett</r1>"])
    assert [p.text for p in docx.Document(io.BytesIO(rebuilt)).paragraphs] == ["Hallo fett"]


async def test_a_file_that_needs_more_memory_than_the_cap_is_413() -> None:
    # python-docx builds an object per element: the file needs far more than 64 MiB to read.
    reader = DocumentReader(ReadingConfig(memory_bytes=64 * 2**20))
    with pytest.raises(PayloadTooLarge, match="needs more than 64 MiB"):
        await reader.units(many_paragraphs(), "docx")


async def test_a_file_that_takes_longer_than_the_deadline_is_413() -> None:
    reader = DocumentReader(ReadingConfig(timeout_s=0.5))
    with pytest.raises(PayloadTooLarge, match=r"took over 0\.5 s"):
        await reader.units(many_paragraphs(), "docx")


async def test_uploads_beyond_those_waiting_are_refused_and_accepted_work_waits() -> None:
    reader = DocumentReader(ReadingConfig(at_once=1, waiting=1))
    data = b"hello"
    first = asyncio.ensure_future(reader.units(data, "txt", "a"))
    second = asyncio.ensure_future(reader.units(data, "txt", "b"))
    await asyncio.sleep(0)  # the first reads, the second waits
    with pytest.raises(Overloaded) as refused:
        await reader.units(data, "txt", "c")
    assert refused.value.retry_after_s > 0
    # A resumed job's read and a rebuild wait their turn instead.
    resumed = asyncio.ensure_future(reader.units(data, "txt"))
    rebuilt = asyncio.ensure_future(reader.rebuilt(data, "txt", ["hallo"]))
    done = await asyncio.gather(first, second, resumed)
    assert [read.units[0].text for read in done] == ["hello"] * 3
    assert await rebuilt == b"hallo"


async def test_one_client_s_uploads_cannot_hold_up_every_other_s() -> None:
    # One reader a process: a client sending heavy files one after another kept every other
    # client's upload waiting behind them, then refused once the queue was full.
    reader = DocumentReader(ReadingConfig(at_once=1, waiting=8, per_client=1))
    heavy = asyncio.ensure_future(reader.units(b"slow", "txt", "attacker"))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="your other documents"):
        await reader.units(b"again", "txt", "attacker")
    assert (await reader.units(b"hello", "txt", "someone")).characters == 5
    await heavy
    assert (await reader.units(b"now", "txt", "attacker")).characters == 3


async def test_a_child_that_dies_is_a_422_and_the_reader_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = DocumentReader()
    monkeypatch.setattr(reading, "_CHILD", [sys.executable, "-c", "import os; os.abort()"])
    with pytest.raises(InvalidInput, match="could not be read"):
        await reader.units(b"hello", "txt")
    monkeypatch.undo()
    assert (await reader.units(b"hello", "txt")).characters == 5


async def test_a_job_that_waits_for_the_runner_holds_none_of_its_document(
    make_settings: MakeSettings,
    fake: FakeControl,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each upload's units were kept in memory until its job ran, any number of jobs queued.
    reads: list[bool] = []  # whether each read was an upload's (a client's)
    units = DocumentReader.units

    async def counted(
        self: DocumentReader, data: bytes, file_format: FileFormat, client: str | None = None
    ) -> Read:
        reads.append(client is not None)
        return await units(self, data, file_format, client)

    monkeypatch.setattr(DocumentReader, "units", counted)
    settings = make_settings(
        data_dir=own_data(data_dir, tmp_path / "data"), warmup=False, document_jobs=1
    )
    auth = {"Authorization": "DeepL-Auth-Key k"}
    async with started(settings, fake.loader(delay_s=0.3)) as client:
        jobs = []
        for n in range(3):
            upload = await client.http.post(
                "/v2/document",
                data={"target_lang": "DE"},
                files=[("file", (f"{n}.txt", f"Paragraph {n}.".encode()))],
                headers=auth,
            )
            assert upload.status_code == 200, upload.text
            jobs.append(upload.json())
        for job in jobs:
            deadline = time.monotonic() + 60
            while True:
                state = await client.http.post(
                    f"/v2/document/{job['document_id']}",
                    json={"document_key": job["document_key"]},
                    headers=auth,
                )
                if state.json()["status"] in ("done", "error"):
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert state.json()["status"] == "done", state.text
    # Three uploads read once each; the two that waited read again when they started.
    assert reads.count(True) == 3
    assert reads.count(False) == 2


async def test_a_reader_that_cannot_start_is_a_429_to_retry_not_the_file_s_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reading, "_CHILD", ["/nonexistent/python"])
    with pytest.raises(Overloaded, match="cannot read documents right now"):
        await DocumentReader().units(b"hello", "txt")
