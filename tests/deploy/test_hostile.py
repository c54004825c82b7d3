"""What an attacker's probe broke, through a real service process (``python -m service``, the
demo model): each test sends the finding's own request and checks the service stays up."""

from __future__ import annotations

import io
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
    process = start_service(own, folder / "service.log")
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
