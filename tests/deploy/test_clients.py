"""More of the clients people already run, unchanged, against a real service process on
loopback: deep-translator (Python) and, through Node.js, the official `deepl-node` library and
the `translate` package. Their hard-coded DeepL hosts are pointed at the service; nothing else
about their requests changes."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deep_translator import DeeplTranslator, LibreTranslator
from deep_translator import deepl as deep_translator_deepl
from deep_translator.exceptions import AuthorizationException

from tests.deploy.conftest import Process, start_service

NODE_CLIENTS = Path(__file__).resolve().parents[1] / "clients" / "node"


@pytest.fixture(scope="module")
def keyed(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A service that requires a key, without a quota (these clients make many calls)."""
    process = start_service(
        data_dir,
        tmp_path_factory.mktemp("clients") / "service.log",
        HYMT_API_KEYS=json.dumps(["client-key"]),
    )
    yield process
    process.stop()


def test_deep_translator_deepl_and_libre(keyed: Process, monkeypatch: pytest.MonkeyPatch) -> None:
    # deep-translator's DeepL sends GET /v2/translate with the legacy auth_key parameter.
    monkeypatch.setitem(deep_translator_deepl.BASE_URLS, "DEEPL_FREE", f"{keyed.url}/{{version}}/")
    deepl = DeeplTranslator(api_key="client-key", source="german", target="english")
    assert isinstance(deepl.translate("Guten Morgen"), str)
    batch = deepl.translate_batch(["Hallo", "Welt"])
    assert len(batch) == 2
    assert all(isinstance(text, str) and text for text in batch)
    with pytest.raises(AuthorizationException):
        DeeplTranslator(api_key="wrong", source="de", target="en").translate("Hallo")
    # Its LibreTranslate posts the parameters in the query string.
    libre_url = f"{keyed.url}/libretranslate/"
    libre = LibreTranslator(source="en", target="de", api_key="client-key", custom_url=libre_url)
    assert isinstance(libre.translate("Good morning"), str)
    with pytest.raises(AuthorizationException):
        LibreTranslator(source="en", target="de", api_key="wrong", custom_url=libre_url).translate(
            "Hi"
        )


@pytest.fixture(scope="module")
def node_report(keyed: Process) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "the Node client tests need Node.js (Debian package nodejs)"
    assert (NODE_CLIENTS / "node_modules" / "deepl-node").is_dir(), (
        "run `npm ci --prefix tests/clients/node` (make test does)"
    )
    done = subprocess.run(
        [node, "drive.mjs", keyed.url, "client-key"],
        cwd=NODE_CLIENTS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_deepl_node_translates_lists_and_counts(node_report: dict[str, Any]) -> None:
    # deepl-node writes language codes its own way (lower case, region upper case).
    assert node_report["deeplText"] == {"ok": {"text": "string", "detected": "de"}}
    assert node_report["deeplBatch"] == {"ok": ["en", "fr"]}
    html = node_report["deeplHtml"]["ok"]
    assert html.startswith("<p>")
    assert "<code>x = 1</code>" in html  # ignore_tags: left as it was
    targets = node_report["deeplTargets"]["ok"]
    assert {"en-US", "en-GB", "pt-BR", "pt-PT", "zh-HANS", "zh-HANT"} <= set(targets)
    assert not {"en", "pt"} & set(targets)  # deprecated targets the client refuses
    assert node_report["deeplUsage"]["ok"]["count"] > 0
    assert node_report["deeplFormality"] == {"ok": True}
    assert node_report["deeplWrongKey"]["error"] == "AuthorizationError"


def test_translate_package_deepl_and_libre(node_report: dict[str, Any]) -> None:
    # `translate`'s deepl engine: POST with every parameter, auth_key included, in the query.
    assert isinstance(node_report["translateDeepl"]["ok"], str)
    assert node_report["translateDeeplWrongKey"] == {
        "error": "Error",
        "message": "Auth Error, please review the key for DeepL",
    }
    # Its libre engine sends the key in the JSON body and the code `pb` for Brazilian Portuguese.
    assert isinstance(node_report["translateLibre"]["ok"], str)
