"""The edges a proxy, a monitor or a shared cache meets: probes answer HEAD and OPTIONS, and an
authenticated GET /translate is not cacheable by shared caches."""

from __future__ import annotations

import pytest

from tests.conftest import ServiceClient


@pytest.mark.parametrize("route", ["/health", "/live"])
async def test_probes_answer_head_and_options(demo: ServiceClient, route: str) -> None:
    head = await demo.http.head(route)
    assert head.status_code == 200
    assert head.content == b""
    options = await demo.http.options(route)
    assert options.status_code == 204
    assert options.headers["allow"] == "GET, HEAD, OPTIONS"


async def test_an_open_service_lets_shared_caches_keep_get_answers(demo: ServiceClient) -> None:
    response = await demo.http.get("/translate", params={"text": "Guten Tag", "target_lang": "en"})
    assert response.headers["cache-control"].startswith("public, max-age=")


async def test_with_keys_get_answers_are_private(keyed: ServiceClient) -> None:
    response = await keyed.http.get(
        "/translate",
        params={"text": "Guten Tag", "target_lang": "en"},
        headers={"Authorization": "Bearer k"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"].startswith("private, max-age=")
