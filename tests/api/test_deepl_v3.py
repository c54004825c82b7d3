"""DeepL's v3 multilingual glossaries and ``custom_instructions`` (issue 38), in process: the
routes' shapes and errors, the dictionary a translation picks, and where the instructions go."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEYS, ServiceClient, StartApp, own_data
from tests.fakes import FakeControl

AUTH = {"Authorization": f"DeepL-Auth-Key {KEYS[0]}"}


async def hy_mt2(start_app: StartApp, tmp_path: Path, data_dir: Path) -> ServiceClient:
    """A keyed Hy-MT2 service (the family with glossary and preferences slots), fake engine,
    with a data directory (and so a glossary file) of its own."""
    client: ServiceClient = await start_app(
        loader=FakeControl(tmp_path / "fake").loader(),
        data_dir=own_data(data_dir, tmp_path / "data"),
        model_family="hy-mt2",
        model_size="1.8b",
        api_keys=list(KEYS),
        warmup=False,
    )
    return client


def spy_options(client: ServiceClient, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The options each batch translation is asked with."""
    seen: list[Any] = []
    translator = client.runtime.translator
    original = translator.translate_batch

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("options"))
        return await original(*args, **kwargs)

    monkeypatch.setattr(translator, "translate_batch", recorded)
    return seen


async def test_a_multilingual_glossary_lives_through_every_v3_route(
    start_app: StartApp, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await hy_mt2(start_app, tmp_path, data_dir)
    http = client.http
    made = await http.post(
        "/v3/glossaries",
        headers=AUTH,
        json={
            "name": "ops",
            "dictionaries": [
                {
                    "source_lang": "EN",
                    "target_lang": "DE",
                    "entries": "node\tKnoten",
                    "entries_format": "tsv",
                },
                {
                    "source_lang": "de",
                    "target_lang": "en",
                    "entries": "Knoten,node",
                    "entries_format": "csv",
                },
            ],
        },
    )
    assert made.status_code == 201, made.text
    glossary = made.json()
    assert glossary["name"] == "ops"
    assert glossary["dictionaries"] == [
        {"source_lang": "en", "target_lang": "de", "entry_count": 1},
        {"source_lang": "de", "target_lang": "en", "entry_count": 1},
    ]
    gid = glossary["glossary_id"]
    assert glossary["creation_time"].endswith("Z")
    listed = (await http.get("/v3/glossaries", headers=AUTH)).json()["glossaries"]
    assert [g["glossary_id"] for g in listed] == [gid]
    # Edited: a term replaced and one added in EN->DE, the name changed.
    edited = await http.patch(
        f"/v3/glossaries/{gid}",
        headers=AUTH,
        json={
            "name": "ops 2",
            "dictionaries": [
                {"source_lang": "en", "target_lang": "de", "entries": "node\tKnotenpunkt\npod\tPod"}
            ],
        },
    )
    assert edited.status_code == 200, edited.text
    assert edited.json()["name"] == "ops 2"
    entries = await http.get(
        f"/v3/glossaries/{gid}/entries",
        params={"source_lang": "EN", "target_lang": "DE"},
        headers=AUTH,
    )
    assert entries.json() == {
        "dictionaries": [
            {
                "source_lang": "en",
                "target_lang": "de",
                "entries": "node\tKnotenpunkt\npod\tPod\n",
                "entries_format": "tsv",
            }
        ]
    }
    replaced = await http.put(
        f"/v3/glossaries/{gid}/dictionaries",
        headers=AUTH,
        json={"source_lang": "DE", "target_lang": "EN", "entries": "Pod\tpod\nKnoten\tnode"},
    )
    assert replaced.json() == {"source_lang": "de", "target_lang": "en", "entry_count": 2}
    # A translation takes the dictionary of its own pair.
    seen = spy_options(client, monkeypatch)
    body = {
        "text": ["Restart the pod."],
        "target_lang": "DE",
        "source_lang": "EN",
        "glossary_id": gid,
    }
    used = await http.post("/v2/translate", headers=AUTH, json=body)
    assert used.status_code == 200, used.text
    assert seen[-1].glossary == (("node", "Knotenpunkt"), ("pod", "Pod"))
    wrong = await http.post("/v2/translate", headers=AUTH, json={**body, "target_lang": "FR"})
    assert wrong.status_code == 400
    assert wrong.json() == {"message": "Glossary does not match the given language pair."}
    # The v2 routes show glossaries of one dictionary only.
    assert (await http.get(f"/v2/glossaries/{gid}", headers=AUTH)).status_code == 400
    assert (await http.get("/v2/glossaries", headers=AUTH)).json() == {"glossaries": []}
    gone = await http.delete(
        f"/v3/glossaries/{gid}/dictionaries",
        params={"source_lang": "de", "target_lang": "en"},
        headers=AUTH,
    )
    assert gone.status_code == 204
    one = (await http.get(f"/v2/glossaries/{gid}", headers=AUTH)).json()
    assert (one["source_lang"], one["target_lang"], one["entry_count"]) == ("en", "de", 2)
    assert (await http.delete(f"/v3/glossaries/{gid}", headers=AUTH)).status_code == 204
    missing = await http.get(f"/v3/glossaries/{gid}", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json() == {"message": "Glossary not found"}


async def test_v3_requests_that_cannot_be_glossaries_get_deepls_400(
    start_app: StartApp, tmp_path: Path, data_dir: Path
) -> None:
    http = (await hy_mt2(start_app, tmp_path, data_dir)).http
    bodies: list[dict[str, object]] = [
        {"dictionaries": [{"source_lang": "en", "target_lang": "de", "entries": "a\tb"}]},
        {"name": "x"},
        {"name": "x", "dictionaries": "en-de"},
        {"name": "x", "dictionaries": [{"source_lang": "en", "target_lang": "de"}]},
        {
            "name": "x",
            "dictionaries": [{"source_lang": "xx", "target_lang": "de", "entries": "a\tb"}],
        },
    ]
    for body in bodies:
        answer = await http.post("/v3/glossaries", headers=AUTH, json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert set(answer.json()) == {"message"}
    unkeyed = await http.get("/v3/glossaries")
    assert unkeyed.status_code == 403
    assert set(unkeyed.json()) == {"message"}


async def test_custom_instructions_reach_hy_mt2_s_preferences(
    start_app: StartApp, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await hy_mt2(start_app, tmp_path, data_dir)
    seen = spy_options(client, monkeypatch)
    body = {
        "text": ["Deploy it."],
        "target_lang": "DE",
        "custom_instructions": ["Keep it short", "Use the informal you"],
    }
    answer = await client.http.post("/v2/translate", headers=AUTH, json=body)
    assert answer.status_code == 200, answer.text
    assert seen[-1].preferences == ("Keep it short", "Use the informal you")
    too_many = {**body, "custom_instructions": ["x"] * 11}
    refused = await client.http.post("/v2/translate", headers=AUTH, json=too_many)
    assert refused.status_code == 400
    assert refused.json() == {"message": "Value for 'custom_instructions' not supported."}
    too_long = {**body, "custom_instructions": ["x" * 301]}
    assert (await client.http.post("/v2/translate", headers=AUTH, json=too_long)).status_code == 400


async def test_custom_instructions_are_refused_where_the_family_has_no_slot(
    keyed: ServiceClient,
) -> None:
    answer = await keyed.http.post(
        "/v2/translate",
        headers=AUTH,
        json={"text": ["Hi."], "target_lang": "DE", "custom_instructions": ["Be brief"]},
    )
    assert answer.status_code == 400
    assert answer.json() == {"message": "'custom_instructions' is not supported by this model."}
