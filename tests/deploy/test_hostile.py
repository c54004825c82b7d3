"""What an attacker's probe broke, through a real service process (``python -m service``, the
demo model): each test sends the finding's own request and checks the service stays up."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docx
import httpx
import pytest

from tests.deploy.conftest import Process, start_service


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _word_file(paragraphs: int = 2) -> bytes:
    document = docx.Document()
    for n in range(paragraphs):
        document.add_paragraph(f"Paragraph number {n} of the minutes.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A valid Word document with one more part, ``word/media/bomb.png``, that inflates to 1 GiB
    (about 1 MB as sent)."""
    out = io.BytesIO(_word_file())
    with (
        zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED, compresslevel=9) as package,
        package.open("word/media/bomb.png", "w", force_zip64=True) as part,
    ):
        zeros = bytes(1 << 20)
        for _ in range(1024):
            part.write(zeros)
    return out.getvalue()


@pytest.fixture(scope="module")
def hostile(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    folder = tmp_path_factory.mktemp("hostile")
    own = folder / "data"
    own.mkdir()
    for built in data_dir.iterdir():  # the demo model, a job store of its own
        if built.name != "documents":
            (own / built.name).symlink_to(built)
    process = start_service(
        own,
        folder / "service.log",
        # The family with glossary and context templates, on its demo model.
        HYMT_MODEL_FAMILY="hy-mt2",
        HYMT_MODEL_SIZE="1.8b",
        HYMT_MAX_GLOSSARY_BYTES_PER_KEY=str(2 * 1024 * 1024),
    )
    yield process
    process.stop()


def _upload(service: Process, name: str, data: bytes) -> httpx.Response:
    return httpx.post(
        f"{service.url}/v2/document",
        data={"target_lang": "DE"},
        files={"file": (name, data)},
        headers={"Authorization": "DeepL-Auth-Key any"},
        timeout=60,
    )


def _restarts(service: Process) -> float:
    metrics = httpx.get(f"{service.url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("hymt_engine_restarts_total{")
    )


def test_a_zip_bomb_docx_is_refused_before_it_inflates(hostile: Process, bomb: bytes) -> None:
    """Finding 1: four 1 MB uploads that inflate to 1 GiB each. Refused (413) from the zip's
    directory; the engine is never killed, the service stays ready, memory stays put."""
    assert len(bomb) < 2 * 1024 * 1024
    # python-docx and lxml loaded, as after any ordinary upload.
    assert _upload(hostile, "warm.docx", _word_file()).status_code == 200
    before = _rss_bytes(hostile.popen.pid)
    for _ in range(4):
        refused = _upload(hostile, "bomb.docx", bomb)
        assert refused.status_code == 413, refused.text
        assert "unpacks to" in refused.json()["message"]
    assert httpx.get(f"{hostile.url}/health").status_code == 200
    assert _restarts(hostile) == 0
    assert _rss_bytes(hostile.popen.pid) - before < 100 * 1024 * 1024
    log = hostile.log.read_text()
    assert "killing it" not in log
    assert "giving up" not in log


def _deepl(service: Process, path: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{service.url}{path}",
        json=body,
        headers={"Authorization": "DeepL-Auth-Key any"},
        timeout=60,
    )


def test_glossaries_and_context_count_against_the_prompt(hostile: Process) -> None:
    """Finding 2: a 40,000-entry glossary and a 100,000-character context. Only the glossary's
    terms found in a text reach its prompt; a prompt over the limit, or a context over its
    bound, is a 4xx naming the part; a key's glossaries are bounded (DeepL's 456)."""
    entries = "".join(f"term{n}\tBegriff{n}\n" for n in range(40_000))
    assert len(entries) > 800_000
    created = _deepl(
        hostile,
        "/v2/glossaries",
        name="huge",
        source_lang="en",
        target_lang="de",
        entries=entries,
        entries_format="tsv",
    )
    assert created.status_code == 201, created.text
    glossary_id = created.json()["glossary_id"]
    shown = httpx.post(
        f"{hostile.url}/prompt",
        json={
            "text": "Replace term12 and term345.",
            "source_lang": "en",
            "target_lang": "de",
            "glossary_id": glossary_id,
        },
    )
    assert shown.status_code == 200, shown.text
    assert "Begriff12" in shown.json()["prompt"]
    assert "Begriff13" not in shown.json()["prompt"]
    assert shown.json()["input_tokens"] < 200
    used = _deepl(
        hostile,
        "/v2/translate",
        text=["Replace term12."],
        source_lang="EN",
        target_lang="DE",
        glossary_id=glossary_id,
    )
    assert used.status_code == 200, used.text
    # Every term of a 3,000-character text found: the prompt outgrows its limit.
    dense = " ".join(f"term{n}" for n in range(1000, 1350))
    refused = httpx.post(
        f"{hostile.url}/translate",
        json={
            "text": dense,
            "source_lang": "en",
            "target_lang": "de",
            "glossary_id": glossary_id,
        },
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith("glossary: the prompt")
    # A context of 100,000 characters: refused before admission, naming it.
    context = httpx.post(
        f"{hostile.url}/translate",
        json={"text": "Hello there.", "target_lang": "de", "context": "Earlier. " * 11_112},
    )
    assert context.status_code == 422
    assert context.json()["error"]["message"].startswith("context: 100008 characters")
    # The key's glossaries are bounded (2 MiB of entries here): the third copy is refused.
    answers = [
        _deepl(
            hostile,
            "/v2/glossaries",
            name=f"copy {n}",
            source_lang="en",
            target_lang="de",
            entries=entries,
            entries_format="tsv",
        )
        for n in range(2)
    ]
    assert [a.status_code for a in answers] == [201, 456]
    assert "Quota exceeded" in answers[1].json()["message"]
    assert httpx.get(f"{hostile.url}/health").status_code == 200


def test_the_service_s_output_is_json_lines_only(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 34, finding 7: non-JSON lines on stderr (the engine process's interpreter shutdown
    printed Triton's reference-leak reports) break a log pipeline that parses every line."""
    folder = tmp_path_factory.mktemp("json-lines")
    process = start_service(data_dir, folder / "service.log")
    answer = httpx.post(
        f"{process.url}/translate", json={"text": "Hello there.", "target_lang": "de"}, timeout=60
    )
    assert answer.status_code == 200
    process.stop()
    assert process.popen.returncode == 0
    lines = process.log.read_text().splitlines()
    assert any("engine process stopped" in line for line in lines)
    for line in lines:
        json.loads(line)
