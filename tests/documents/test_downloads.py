"""A result is served once, counted only when it arrived; a job can be deleted (issue 34)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from starlette.types import Message

from tests.conftest import ServiceClient, StartApp, own_data
from tests.fakes import FakeControl

AUTH = {"Authorization": "DeepL-Auth-Key k"}


def _own(data_dir: Path, tmp_path: Path) -> Path:
    """A job store of the test's own: other tests' jobs hold the open service's slots."""
    return own_data(data_dir, tmp_path / "data")


async def _done_job(client: ServiceClient) -> dict[str, str]:
    upload = await client.http.post(
        "/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("a.txt", b"Hello there.")},
        headers=AUTH,
    )
    assert upload.status_code == 200, upload.text
    job: dict[str, str] = upload.json()
    deadline = time.monotonic() + 30
    while (await _status(client, job)).json()["status"] != "done":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    return job


async def _status(client: ServiceClient, job: dict[str, str]) -> httpx.Response:
    return await client.http.post(
        f"/v2/document/{job['document_id']}",
        json={"document_key": job["document_key"]},
        headers=AUTH,
    )


async def test_a_download_that_fails_on_its_way_can_be_asked_for_again(
    start_app: StartApp, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    client = await start_app(loader=fake.loader(), warmup=False, data_dir=_own(data_dir, tmp_path))
    job = await _done_job(client)
    body = f'{{"document_key": "{job["document_key"]}"}}'.encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/v2/document/{job['document_id']}/result",
        "raw_path": b"",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"DeepL-Auth-Key k"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("service", 80),
    }
    sent: list[Message] = []
    reads = 0

    async def receive() -> Message:
        nonlocal reads
        reads += 1
        if reads > 1:  # the client stays connected
            await asyncio.Event().wait()
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the connection broke")  # as a proxy refusing the answer does
        sent.append(message)

    await client.app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert (await _status(client, job)).json()["status"] == "done"
    again = await client.http.post(
        f"/v2/document/{job['document_id']}/result",
        json={"document_key": job["document_key"]},
        headers=AUTH,
    )
    assert again.status_code == 200
    assert again.text
    assert (await _status(client, job)).json()["status"] == "downloaded"


async def test_a_deleted_job_is_gone_and_frees_its_slot(
    start_app: StartApp, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    client = await start_app(
        loader=fake.loader(),
        warmup=False,
        max_documents_per_key=1,
        data_dir=_own(data_dir, tmp_path),
    )
    job = await _done_job(client)
    deleted = await client.http.request(
        "DELETE",
        f"/v2/document/{job['document_id']}",
        json={"document_key": job["document_key"]},
        headers=AUTH,
    )
    assert deleted.status_code == 204
    assert (await _status(client, job)).status_code == 404
    await _done_job(client)  # the one slot is free again


async def test_links_to_results_are_built_on_the_public_origin(
    start_app: StartApp, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    """Issue 34, finding 7: the link reflected whatever Host header the client sent."""
    client = await start_app(
        loader=fake.loader(),
        warmup=False,
        public_origin="https://mt.example.com:8443",
        data_dir=_own(data_dir, tmp_path),
    )
    upload = await client.http.post(
        "/libretranslate/translate_file",
        data={"source": "en", "target": "de"},
        files={"file": ("a.txt", b"Hello there.")},
        headers={"Host": "attacker.example"},
    )
    assert upload.status_code == 200, upload.text
    link = upload.json()["translatedFileUrl"]
    assert link.startswith("https://mt.example.com:8443/libretranslate/download_file/")
