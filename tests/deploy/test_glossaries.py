"""Glossaries as resources through real service processes: created with the official DeepL
client, used by DeepL and native translations, still there after a restart, invisible to
another key, deleted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import deepl
import httpx
import pytest
from deepl.api_data import MultilingualGlossaryDictionaryEntries as Dictionary

from tests.conftest import own_data
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
    own = own_data(data_dir, tmp_path / "data")
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


def test_multilingual_glossaries_through_the_official_client(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: DeepL's v3 glossaries with the unmodified ``deepl`` client against a service
    process: two dictionaries created, listed, fetched, edited, replaced, used for a text and a
    document, a dictionary deleted, the glossary deleted; custom instructions taken by Hy-MT2."""
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    own = own_data(data_dir, tmp_path / "data")
    service = _start(own, tmp_path / "service.log")
    try:
        client = deepl.DeepLClient("owner-key", server_url=service.url)
        made = client.create_multilingual_glossary(
            "ops",
            [
                Dictionary("EN", "DE", {"node": "Knoten"}),
                Dictionary("DE", "EN", {"Knoten": "node"}),
            ],
        )
        pairs = [(d.source_lang, d.target_lang, d.entry_count) for d in made.dictionaries]
        assert pairs == [("EN", "DE", 1), ("DE", "EN", 1)]
        assert [g.glossary_id for g in client.list_multilingual_glossaries()] == [made.glossary_id]
        assert client.get_multilingual_glossary(made.glossary_id).name == "ops"
        edited = client.update_multilingual_glossary_dictionary(
            made, Dictionary("EN", "DE", {"pod": "Pod"})
        )
        assert [d.entry_count for d in edited.dictionaries] == [2, 1]
        client.update_multilingual_glossary_name(made, "ops 2")
        replaced = client.replace_multilingual_glossary_dictionary(
            made, Dictionary("DE", "EN", {"Pod": "pod"})
        )
        assert replaced.entry_count == 1
        got = client.get_multilingual_glossary_entries(made, "EN", "DE")
        entries = deepl.util.convert_tsv_to_dict(str(got.dictionaries[0].entries))
        assert entries == {"node": "Knoten", "pod": "Pod"}
        fresh = client.get_multilingual_glossary(made.glossary_id)
        text = client.translate_text(
            "Restart the pod.", source_lang="EN", target_lang="DE", glossary=fresh
        )
        assert isinstance(text, deepl.TextResult)
        out = io.BytesIO()
        status = client.translate_document(
            b"Restart the node.", out, source_lang="EN", target_lang="DE",
            filename="ops.txt", glossary=fresh,
        )  # fmt: skip
        assert status.done
        assert out.getvalue()
        instructed = client.translate_text(
            "Restart the pod.", target_lang="DE", custom_instructions=["Keep it short"]
        )
        assert isinstance(instructed, deepl.TextResult)
        client.delete_multilingual_glossary_dictionary(made, source_lang="DE", target_lang="EN")
        left = client.get_multilingual_glossary(made.glossary_id)
        assert [(d.source_lang, d.target_lang) for d in left.dictionaries] == [("EN", "DE")]
        client.delete_multilingual_glossary(made)
        assert client.list_multilingual_glossaries() == []
        with pytest.raises(deepl.GlossaryNotFoundException):
            client.get_multilingual_glossary(made.glossary_id)
    finally:
        service.stop()


def test_custom_instructions_are_refused_by_hunyuan_mt_in_deepls_shape(
    data_dir: Path, tmp_path: Path
) -> None:
    service = start_service(data_dir, tmp_path / "service.log", HYMT_API_KEYS=KEYS)
    try:
        client = deepl.DeepLClient("owner-key", server_url=service.url)
        with pytest.raises(deepl.DeepLException, match="custom_instructions"):
            client.translate_text("Hi.", target_lang="DE", custom_instructions=["Be brief"])
        raw = httpx.post(
            f"{service.url}/v2/translate",
            json={"text": ["Hi."], "target_lang": "DE", "custom_instructions": ["Be brief"]},
            headers={"Authorization": "DeepL-Auth-Key owner-key"},
        )
        assert raw.status_code == 400
        assert raw.json() == {"message": "'custom_instructions' is not supported by this model."}
    finally:
        service.stop()
