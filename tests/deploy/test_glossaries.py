"""Glossaries as resources through real service processes: created with the official DeepL
client, used by DeepL and native translations, still there after a restart, invisible to
another key, deleted."""

from __future__ import annotations

import json
from pathlib import Path

import deepl
import httpx
import pytest

from tests.deploy.conftest import Process, start_service

KEYS = json.dumps(["owner-key", "other-key"])


def _start(data_dir: Path, log: Path) -> Process:
    return start_service(
        data_dir, log, HYMT_API_KEYS=KEYS, HYMT_MODEL_FAMILY="hy-mt2", HYMT_MODEL_SIZE="1.8b"
    )


def test_glossaries_persist_belong_to_their_key_and_reach_the_prompt(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    # A data directory of this test's own: its glossary file starts empty.
    own = tmp_path / "data"
    own.mkdir()
    for built in data_dir.iterdir():
        (own / built.name).symlink_to(built)
    service = _start(own, tmp_path / "first.log")
    try:
        owner = deepl.Translator("owner-key", server_url=service.url)
        pairs = owner.get_glossary_languages()
        assert any((p.source_lang, p.target_lang) == ("en", "de") for p in pairs)
        glossary = owner.create_glossary(
            "ops",
            source_lang="EN",
            target_lang="DE",
            entries={"cluster": "Verbund", "node": "Knoten"},
        )
        assert glossary.entry_count == 2
        assert glossary.source_lang == "EN"
        used = owner.translate_text(
            "Restart the node.", source_lang="EN", target_lang="DE", glossary=glossary
        )
        assert isinstance(used, deepl.TextResult)
        unsourced = httpx.post(
            f"{service.url}/v2/translate",
            json={"text": ["Restart."], "target_lang": "DE", "glossary_id": glossary.glossary_id},
            headers={"Authorization": "DeepL-Auth-Key owner-key"},
        )
        assert unsourced.status_code == 400
        assert "source_lang" in unsourced.json()["message"]
        shown = httpx.post(
            f"{service.url}/prompt",
            json={
                "text": "Restart the node of the cluster.",
                "source_lang": "en",
                "target_lang": "de",
                "glossary_id": glossary.glossary_id,
            },
            headers={"Authorization": "Bearer owner-key"},
        )
        assert shown.status_code == 200, shown.text
        assert "cluster translates to Verbund\nnode translates to Knoten" in shown.json()["prompt"]
    finally:
        service.stop()

    service = _start(own, tmp_path / "second.log")
    try:
        owner = deepl.Translator("owner-key", server_url=service.url)
        (kept,) = owner.list_glossaries()
        assert kept.glossary_id == glossary.glossary_id
        assert owner.get_glossary_entries(kept) == {"cluster": "Verbund", "node": "Knoten"}
        other = deepl.Translator("other-key", server_url=service.url)
        assert other.list_glossaries() == []
        with pytest.raises(deepl.GlossaryNotFoundException):
            other.get_glossary(glossary.glossary_id)
        with pytest.raises(deepl.GlossaryNotFoundException):
            other.delete_glossary(glossary.glossary_id)
        refused = httpx.post(
            f"{service.url}/translate",
            json={
                "text": "x",
                "source_lang": "en",
                "target_lang": "de",
                "glossary_id": kept.glossary_id,
            },
            headers={"Authorization": "Bearer other-key"},
        )
        assert refused.status_code == 404
        owner.delete_glossary(kept)
        assert owner.list_glossaries() == []
    finally:
        service.stop()
