"""API keys, per-client rate and character quotas, CORS, and texts kept out of logs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config.settings import Settings
from tests.conftest import StartApp
from tests.fakes import FakeControl

BODY = {"text": "hello", "target_lang": "de"}


def everything_logged(caplog: pytest.LogCaptureFixture) -> str:
    return " ".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)


async def test_keys_required_401_without_403_wrong_200_right(
    start_app: StartApp, fake: FakeControl, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# team keys\nfile-key-1\n\n")
    client = await start_app(loader=fake.loader(), api_keys=["env-key"], api_keys_file=keys_file)
    missing = await client.http.post("/translate", json=BODY)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "unauthenticated"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = await client.http.post("/translate", json=BODY, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "forbidden"
    for key in ("env-key", "file-key-1"):
        ok = await client.http.post(
            "/translate", json=BODY, headers={"Authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200, key
    assert (await client.http.get("/languages")).status_code == 401
    assert (await client.http.get("/health")).status_code == 200  # probes stay open
    assert (await client.http.get("/live")).status_code == 200


async def test_keys_never_reach_the_logs(
    start_app: StartApp, fake: FakeControl, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start_app(loader=fake.loader(), api_keys=["s3cret-key"])
    with caplog.at_level(logging.DEBUG):
        await client.http.post(
            "/translate", json=BODY, headers={"Authorization": "Bearer s3cret-key"}
        )
        await client.http.post("/translate", json=BODY, headers={"Authorization": "Bearer guess"})
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "s3cret-key" not in logged
    assert "guess" not in logged


async def test_texts_stay_out_of_logs_by_default(
    start_app: StartApp, fake: FakeControl, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start_app(loader=fake.loader())
    with caplog.at_level(logging.DEBUG):
        await client.http.post(
            "/translate", json={"text": "my private letter", "target_lang": "de"}
        )
    assert "private letter" not in " ".join(
        f"{r.getMessage()} {r.__dict__}" for r in caplog.records
    )


async def test_one_clients_burst_does_not_starve_another(
    start_app: StartApp, fake: FakeControl
) -> None:
    client = await start_app(loader=fake.loader(), api_keys=["a", "b"], rate_limit="5/minute")
    burst = await asyncio.gather(
        *(
            client.http.post("/translate", json=BODY, headers={"Authorization": "Bearer a"})
            for _ in range(8)
        )
    )
    statuses = sorted(r.status_code for r in burst)
    assert statuses == [200] * 5 + [429] * 3
    refused = next(r for r in burst if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    other = await client.http.post("/translate", json=BODY, headers={"Authorization": "Bearer b"})
    assert other.status_code == 200


async def test_character_quota_per_client(start_app: StartApp, fake: FakeControl) -> None:
    client = await start_app(loader=fake.loader(), char_quota="20/hour")
    first = await client.http.post("/translate", json={"text": "x" * 15, "target_lang": "de"})
    assert first.status_code == 200
    over = await client.http.post(
        "/batch_translate", json={"texts": ["y" * 5, "z" * 5], "target_lang": "de"}
    )
    assert over.status_code == 429
    assert "character quota" in over.json()["error"]["message"]


async def test_cors_is_off_by_default_and_configurable(
    start_app: StartApp, fake: FakeControl
) -> None:
    plain = await start_app(loader=fake.loader())
    response = await plain.http.options(
        "/translate",
        headers={"Origin": "https://example.com", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in response.headers
    allowed = await start_app(loader=fake.loader(), cors_origins=["https://example.com"])
    response = await allowed.http.options(
        "/translate",
        headers={"Origin": "https://example.com", "Access-Control-Request-Method": "POST"},
    )
    assert response.headers["access-control-allow-origin"] == "https://example.com"


def test_malformed_rates_are_refused_at_start() -> None:
    with pytest.raises(ValidationError):
        Settings(_env_file=None, rate_limit="lots")
