"""Glossaries on a service without keys, through HTTP from two client addresses (127.0.0.1 and
127.0.0.2, both loopback): every client uses every glossary, only its creator changes it."""

from __future__ import annotations

from pathlib import Path

import httpx

from service.config.settings import Settings
from tests.conftest import own_data, served
from tests.fakes import FakeControl


def test_a_stranger_can_use_a_glossary_but_not_delete_it(
    data_dir: Path, tmp_path: Path, fake: FakeControl
) -> None:
    settings = Settings(
        _env_file=None,
        data_dir=own_data(data_dir, tmp_path / "data"),
        warmup=False,
        model_family="hy-mt2",
        redis_url=None,
    )
    with served(settings, fake.loader()) as creator:
        made = creator.post(
            "/v2/glossaries",
            json={
                "name": "team",
                "source_lang": "en",
                "target_lang": "de",
                "entries": "node\tKnoten",
                "entries_format": "tsv",
            },
        )
        assert made.status_code == 201, made.text
        glossary_id = made.json()["glossary_id"]
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=creator.base_url, transport=elsewhere, timeout=30) as stranger:
            listed = stranger.get("/v2/glossaries").json()["glossaries"]
            assert [g["glossary_id"] for g in listed] == [glossary_id]
            used = stranger.post(
                "/v2/translate",
                json={
                    "text": ["node"],
                    "source_lang": "EN",
                    "target_lang": "DE",
                    "glossary_id": glossary_id,
                },
            )
            assert used.status_code == 200, used.text
            refused = stranger.delete(f"/v2/glossaries/{glossary_id}")
            assert refused.status_code == 403, refused.text
            assert "only the client that created" in refused.json()["message"]
        assert creator.get(f"/v2/glossaries/{glossary_id}").status_code == 200
        assert creator.delete(f"/v2/glossaries/{glossary_id}").status_code == 204
