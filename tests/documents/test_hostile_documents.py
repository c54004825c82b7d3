"""Documents an attacker or an unlucky user sends (issue 34, finding 5), through a served app
(uvicorn on loopback) and the official ``deepl`` client, on a fake engine: a model answer XML
cannot carry, 3,000 lines or runs, a quota that refuses the upload, billing of run tags."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import deepl
import docx
import httpx
import pytest

from service.config.settings import Settings
from service.frontend.documents import formats, reading
from tests.conftest import own_data, served
from tests.documents.test_reading import many_paragraphs
from tests.fakes import FakeControl

KEY = "doc-key"
AUTH = {"Authorization": f"DeepL-Auth-Key {KEY}"}


def _word(paragraphs: list[str]) -> bytes:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _upload(client: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return client.post(
        "/v2/document", data={"target_lang": "DE"}, files={"file": (name, data)}, headers=AUTH
    )


def _wait(client: httpx.Client, job: dict[str, str], timeout_s: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status: dict[str, object] = client.post(
            f"/v2/document/{job['document_id']}",
            json={"document_key": job["document_key"]},
            headers=AUTH,
        ).json()
        if status["status"] in ("done", "error"):
            return status
        time.sleep(0.1)
    raise AssertionError(f"{job} did not finish")


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> FakeControl:
    return FakeControl(tmp_path_factory.mktemp("documents-fake"))


@pytest.fixture(scope="module")
def documents(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory, controls: FakeControl
) -> Iterator[httpx.Client]:
    """A model whose every answer holds characters XML cannot carry; a small queue, so a
    document that is not paced fills it."""
    configured = Settings(
        _env_file=None,
        data_dir=own_data(data_dir, tmp_path_factory.mktemp("documents") / "data"),
        warmup=False,
        api_keys=[KEY],
        max_queue_size=256,
        request_timeout_s=60,
        document_read_memory_mib=64,
    )
    with served(configured, controls.loader(answer="Hallo\x01 Welt\x0b\x1f.")) as client:
        yield client


def test_a_translation_xml_cannot_carry_still_makes_a_valid_docx(
    documents: httpx.Client, tmp_path: Path
) -> None:
    """Six paragraphs through the deepl client; the model answers with control characters."""
    translator = deepl.Translator(KEY, server_url=str(documents.base_url))
    source = tmp_path / "minutes.docx"
    source.write_bytes(_word([f"Paragraph {n} of the minutes." for n in range(6)]))
    target = tmp_path / "minutes_de.docx"
    translator.translate_document_from_filepath(source, target, target_lang="DE")
    translated = docx.Document(str(target))
    texts = [p.text for p in translated.paragraphs]
    assert texts == ["Hallo Welt."] * 6


def test_3000_lines_and_3000_runs_finish_without_refusing_live_traffic(
    documents: httpx.Client,
) -> None:
    lines = "".join(f"Line number {n} of a long file.\n" for n in range(3000)).encode()
    runs = ("<html><body>" + "".join(f"<p>Run {n}.</p>" for n in range(3000))).encode()
    jobs = [_upload(documents, "long.txt", lines), _upload(documents, "runs.html", runs)]
    assert [j.status_code for j in jobs] == [200, 200], [j.text for j in jobs]
    live: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=documents.base_url, headers=AUTH, timeout=30) as client:
            while not stop.is_set():
                answer = client.post(
                    "/v2/translate", json={"text": ["Live request."], "target_lang": "DE"}
                )
                live.append(answer.status_code)
                time.sleep(0.02)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        statuses = [_wait(documents, job.json()) for job in jobs]
    finally:
        stop.set()
        sender.join()
    assert [s["status"] for s in statuses] == ["done", "done"], statuses
    assert live
    assert set(live) == {200}, live


def test_a_file_that_needs_more_memory_to_read_is_413_and_never_read_in_the_api_process(
    documents: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """250,000 one-letter paragraphs (9.3 MB) were read by python-docx in the API process,
    seconds of CPU holding its event loop's GIL and hundreds of MB each, any number at once."""

    def not_here(*args: object, **kwargs: object) -> object:
        raise AssertionError("a document read in the API process")

    monkeypatch.setattr(formats, "parse", not_here)
    monkeypatch.setattr(reading, "parse", not_here)
    heavy = _upload(documents, "heavy.docx", many_paragraphs())
    assert heavy.status_code == 413, heavy.text
    assert "needs more than 64 MiB" in heavy.json()["message"]
    fits = _upload(documents, "fits.docx", _word(["Hello there."]))
    assert fits.status_code == 200, fits.text
    assert _wait(documents, fits.json())["status"] == "done"


def test_billed_characters_are_the_source_text_s(documents: httpx.Client) -> None:
    """32 characters in two formatting runs were billed 41 (the service's run tags)."""
    document = docx.Document()
    paragraph = document.add_paragraph("a" * 16)
    paragraph.add_run("b" * 16).bold = True
    out = io.BytesIO()
    document.save(out)
    job = _upload(documents, "billed.docx", out.getvalue())
    assert _wait(documents, job.json())["billed_characters"] == 32


def test_an_upload_refused_for_quota_makes_no_job(
    data_dir: Path, tmp_path: Path, controls: FakeControl
) -> None:
    configured = Settings(
        _env_file=None,
        data_dir=own_data(data_dir, tmp_path / "data"),
        warmup=False,
        api_keys=[KEY],
        char_quota="100/day",
        redis_url=None,
    )
    with served(configured, controls.loader()) as client:
        refused = _upload(client, "big.txt", b"A sentence of the file. " * 10)
        assert refused.status_code == 456, refused.text
        jobs = [p for p in (tmp_path / "data" / "documents").iterdir() if p.is_dir()]
        assert jobs == []
        fits = _upload(client, "small.txt", b"Short.")
        assert fits.status_code == 200
