"""What a document built to be costly to read does to a running service: one upload of a Word
file of many one-letter paragraphs, ``/health`` polled every 10 ms from before it until after
the uploads are answered (``--uploads`` at once, from one client), and the API process's
resident memory after. Prints a JSON report.

    python -m loadtests.heavy_document --url http://127.0.0.1:8000 [--paragraphs 250000]
        [--uploads 1]

The file is stored, not deflated, so that no zip ratio check refuses it; 250,000 paragraphs
make some 9.3 MB, under the default 10 MiB upload limit. ``--pid`` names the API process whose
memory to read (on Linux, from ``/proc``); without it, none is read.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import threading
import time
import zipfile
from pathlib import Path

import docx
import httpx

_NS = b'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def heavy_word_file(paragraphs: int = 250_000) -> bytes:
    """A Word file of ``paragraphs`` one-letter paragraphs, stored, not deflated."""
    plain = io.BytesIO()
    docx.Document().save(plain)
    body = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * paragraphs
    document = b"<w:document " + _NS + b"><w:body>" + body + b"</w:body></w:document>"
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(plain.getvalue())) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as package,
    ):
        for item in source.infolist():
            data = document if item.filename == "word/document.xml" else source.read(item)
            item.compress_type = zipfile.ZIP_STORED
            package.writestr(item, data)
    return out.getvalue()


def _resident_mb(pid: int) -> float | None:
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def measure(url: str, paragraphs: int, uploads: int, pid: int | None) -> dict[str, object]:
    data = heavy_word_file(paragraphs)
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get("/health")
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1.0)
    started = time.perf_counter()
    statuses: list[int] = []

    def upload() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            answer = client.post(
                "/v2/document", data={"target_lang": "DE"}, files={"file": ("heavy.docx", data)}
            )
        statuses.append(answer.status_code)

    senders = [threading.Thread(target=upload) for _ in range(uploads)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    answered_s = time.perf_counter() - started
    time.sleep(0.5)
    stop.set()
    poller.join()
    ordered = sorted(latencies)
    return {
        "file_bytes": len(data),
        "paragraphs": paragraphs,
        "upload_statuses": sorted(statuses),
        "uploads_answered_s": round(answered_s, 2),
        "health_requests": len(ordered),
        "health_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "health_p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 2),
        "health_max_ms": round(ordered[-1] * 1000, 2),
        "api_resident_mb_after": _resident_mb(pid) if pid is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--paragraphs", type=int, default=250_000)
    parser.add_argument("--uploads", type=int, default=1, help="sent at once, one client")
    parser.add_argument("--pid", type=int, default=None, help="the API process, for its memory")
    args = parser.parse_args()
    print(json.dumps(measure(args.url, args.paragraphs, args.uploads, args.pid), indent=2))


if __name__ == "__main__":
    main()
