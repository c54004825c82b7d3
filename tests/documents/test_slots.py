"""Document slots are per client: on a service without keys, one client's address filling its
slots (and never downloading) does not refuse another's uploads."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import StartApp, own_data
from tests.fakes import FakeControl


async def test_one_client_of_an_open_service_cannot_take_every_document_slot(
    start_app: StartApp, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    client = await start_app(
        loader=fake.loader(),
        warmup=False,
        data_dir=own_data(data_dir, tmp_path / "data"),
        max_documents_per_key=2,
    )

    def from_address(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=client.app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://service")

    async def upload(http: httpx.AsyncClient) -> httpx.Response:
        return await http.post(
            "/v2/document", data={"target_lang": "DE"}, files={"file": ("a.txt", b"Hello.")}
        )

    async with from_address("10.0.0.1") as greedy, from_address("10.0.0.2") as other:
        held = [(await upload(greedy)).status_code for _ in range(3)]
        assert held == [200, 200, 429]
        # Another address still has its own slots.
        mine = await upload(other)
        assert mine.status_code == 200, mine.text
        job = mine.json()
        # An open service's job is reached by its key, from wherever.
        status = await greedy.post(
            f"/v2/document/{job['document_id']}", json={"document_key": job["document_key"]}
        )
        assert status.status_code == 200, status.text
