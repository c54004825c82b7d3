"""A full disk is the operator's problem, told as such: an upload or a glossary that cannot be
stored is a 507 with a Retry-After in the route's own shape (not an internal error), and leaves
nothing half-written behind."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import httpx
import pytest

from service.contract.errors import StorageFull
from service.frontend.sqlite import Database
from tests.conftest import StartApp, own_data
from tests.fakes import FakeControl

AUTH = {"Authorization": "DeepL-Auth-Key k"}


def test_a_database_that_cannot_grow_is_storage_full_and_rolled_back(tmp_path: Path) -> None:
    database = Database(tmp_path / "x.sqlite3", "CREATE TABLE IF NOT EXISTS t (v BLOB);")
    with database.transaction() as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        # SQLite's own "database or disk is full": the file may not grow past its pages now.
        db.execute(f"PRAGMA max_page_count = {pages + 1}")
    with pytest.raises(StorageFull, match="storage is full"), database.transaction() as db:
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 1_000_000,))
    with database.transaction() as db:
        assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0
    with pytest.raises(sqlite3.OperationalError), database.transaction() as db:
        db.execute("SELECT * FROM no_such_table")  # other errors stay what they are
    database.close()


async def test_an_upload_onto_a_full_disk_is_507_and_leaves_no_job(
    start_app: StartApp,
    fake: FakeControl,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = own_data(data_dir, tmp_path / "data")
    client = await start_app(loader=fake.loader(), warmup=False, data_dir=own)
    write_bytes = Path.write_bytes

    def full(path: Path, data: bytes) -> int:
        if path.name.startswith("source."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(path, data)

    async def upload_one() -> httpx.Response:
        response: httpx.Response = await client.http.post(
            "/v2/document",
            data={"target_lang": "DE"},
            files={"file": ("a.txt", b"Hello there.")},
            headers=AUTH,
        )
        return response

    monkeypatch.setattr(Path, "write_bytes", full)
    upload = await upload_one()
    assert upload.status_code == 507, upload.text
    assert upload.json() == {"message": "the service's storage is full; try again later"}
    assert upload.headers["retry-after"] == "5"
    folder = own / "documents"
    assert [p.name for p in folder.iterdir() if p.is_dir()] == []  # no job folder left
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    again = await upload_one()
    assert again.status_code == 200, again.text
