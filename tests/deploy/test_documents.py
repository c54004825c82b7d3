"""Documents through a real service process: a Word file and subtitles round trip through the
DeepL document API with the official ``deepl`` client, a Markdown file through LibreTranslate's
``/translate_file`` with a LibreTranslate client; a result is served once and to its owner only;
bounds are client errors; after a crash and a restart, a finished job is still there and the
one that was translating is resumed from its file and translates again."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import deepl
import docx
import httpx
import pytest
from libretranslate_aio import LibreTranslate

from tests.deploy.conftest import Process, start_service

KEYS = json.dumps(["owner-key", "other-key"])
SRT = (
    "1\n00:00:01,000 --> 00:00:02,500\nGood morning.\nHow are you?\n\n"
    "2\n00:00:03,000 --> 00:00:04,000\n<i>Fine, thanks.</i>\n"
)
MARKDOWN = "# Notes\n\nThe first paragraph. It has two sentences.\n\n- one item\n- another item\n"


def _start(data_dir: Path, log: Path, **env: str) -> Process:
    return start_service(data_dir, log, HYMT_API_KEYS=KEYS, HYMT_MAX_DOCUMENTS_PER_KEY="4", **env)


def _own_data(data_dir: Path, tmp_path: Path) -> Path:
    """A data directory of the test's own (its job store starts empty) sharing the demo model."""
    own = tmp_path / "data"
    own.mkdir()
    for built in data_dir.iterdir():
        if built.name != "documents":
            (own / built.name).symlink_to(built)
    return own


def _word_file() -> bytes:
    document = docx.Document()
    paragraph = document.add_paragraph("Welcome to the ")
    paragraph.add_run("annual").bold = True
    paragraph.add_run(" meeting.")
    document.add_paragraph("Second paragraph.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _upload(service: Process, name: str, data: bytes, key: str = "owner-key") -> httpx.Response:
    return httpx.post(
        f"{service.url}/v2/document",
        data={"target_lang": "DE"},
        files={"file": (name, data)},
        headers={"Authorization": f"DeepL-Auth-Key {key}"},
        timeout=30,
    )


def _status(service: Process, job: dict[str, str], key: str = "owner-key") -> httpx.Response:
    return httpx.post(
        f"{service.url}/v2/document/{job['document_id']}",
        json={"document_key": job["document_key"]},
        headers={"Authorization": f"DeepL-Auth-Key {key}"},
    )


def _wait_done(service: Process, job: dict[str, str]) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status: dict[str, object] = _status(service, job).json()
        if status["status"] in ("done", "error"):
            return status
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not finish")


def test_documents_round_trip_are_owned_bounded_and_survive_a_crash(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    own = _own_data(data_dir, tmp_path)
    service = _start(own, tmp_path / "first.log")
    try:
        owner = deepl.Translator("owner-key", server_url=service.url)
        # Word: the paragraphs and the bold run come back, translated.
        out = io.BytesIO()
        status = owner.translate_document(
            _word_file(), out, target_lang="DE", filename="minutes.docx"
        )
        assert status.done
        assert status.billed_characters is not None
        assert status.billed_characters > 0
        translated = docx.Document(io.BytesIO(out.getvalue()))
        assert len(translated.paragraphs) == 2
        runs = translated.paragraphs[0].runs
        assert [run.bold for run in runs] == [None, True, None]
        assert all(run.text.strip() for run in runs)
        assert translated.paragraphs[0].text != "Welcome to the annual meeting."
        # Subtitles: numbers, timing lines and the italic tags stay.
        out = io.BytesIO()
        owner.translate_document(SRT.encode(), out, target_lang="DE", filename="talk.srt")
        subtitles = out.getvalue().decode()
        lines = subtitles.split("\n")
        assert lines[:2] == ["1", "00:00:01,000 --> 00:00:02,500"]
        assert "2\n00:00:03,000 --> 00:00:04,000\n<i>" in subtitles
        assert subtitles.rstrip().endswith("</i>")
        assert "Good morning." not in subtitles

        # LibreTranslate's translate_file, with a LibreTranslate client.
        with LibreTranslate(base_url=f"{service.url}/libretranslate", api_key="owner-key") as lt:
            upload = io.BytesIO(MARKDOWN.encode())
            upload.name = "notes.md"
            result = lt.translate_file(upload, source="en", target="de")
        link = result.translated_file_url
        assert link.endswith("/notes_de.md")
        page = httpx.get(link)
        assert page.status_code == 200
        markdown = page.text
        assert markdown.startswith("# ")
        assert "\n\n- " in markdown
        assert markdown.count("\n- ") == 2
        assert httpx.get(link).status_code == 404  # served once

        # A result is served once, and only to its owner.
        job = _upload(service, "a.txt", b"Hello there. How are you?").json()
        assert _wait_done(service, job)["status"] == "done"
        assert _status(service, job, key="other-key").status_code == 404
        again = {"document_key": job["document_key"]}
        auth = {"Authorization": "DeepL-Auth-Key owner-key"}
        result_url = f"{service.url}/v2/document/{job['document_id']}/result"
        stranger = {"Authorization": "DeepL-Auth-Key other-key"}
        assert httpx.post(result_url, json=again, headers=stranger).status_code == 404
        first = httpx.post(result_url, json=again, headers=auth)
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/plain")
        assert httpx.post(result_url, json=again, headers=auth).status_code == 404
        assert _status(service, job).json()["status"] == "downloaded"
        wrong_key = {"document_key": "0" * 64}
        assert httpx.post(result_url, json=wrong_key, headers=auth).status_code == 404

        # Bounds and bad files: 4xx in DeepL's shape, no job made.
        refused = _upload(service, "paper.pdf", b"%PDF-1.7")
        assert refused.status_code in (400, 422)
        assert "message" in refused.json()
        assert _upload(service, "big.txt", b"a" * (11 * 1024 * 1024)).status_code == 413
        assert _upload(service, "empty.txt", b"").status_code in (400, 422)
        not_utf8 = _upload(service, "latin.txt", "é".encode("latin-1"))
        assert not_utf8.status_code in (400, 422)
        assert "UTF-8" in not_utf8.json()["message"]
        # Four held at most (downloaded ones no longer count).
        held = [_upload(service, f"n{n}.txt", b"One more.") for n in range(5)]
        assert [r.status_code for r in held] == [200, 200, 200, 200, 429]
        assert "too many documents" in held[-1].json()["message"]

        # A finished job, and a long one killed while translating.
        done = held[0].json()
        assert _wait_done(service, done)["status"] == "done"
        long_text = "".join(f"Line number {n} of a long file.\n" for n in range(20_000))
        running = _upload(service, "long.txt", long_text.encode(), key="other-key").json()
        deadline = time.monotonic() + 60
        while _status(service, running, key="other-key").json()["status"] == "queued":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        service.popen.send_signal(signal.SIGKILL)
        service.popen.wait()
    finally:
        service.stop()
    service = _start(own, tmp_path / "second.log")
    try:
        # The job killed mid-way is resumed from its file, not failed: it translates again.
        deadline = time.monotonic() + 60
        while (
            "seconds_remaining" not in (after := _status(service, running, key="other-key")).json()
        ):
            assert after.json()["status"] in ("queued", "translating"), after.text
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _status(service, done).json()["status"] == "done"
        kept = httpx.post(
            f"{service.url}/v2/document/{done['document_id']}/result",
            json={"document_key": done["document_key"]},
            headers={"Authorization": "DeepL-Auth-Key owner-key"},
        )
        assert kept.status_code == 200
        assert kept.text.strip()
    finally:
        service.stop()
