"""The shipped nginx config, run by the real nginx in front of the real service."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests import stack
from service.config.settings import Settings
from tests.deploy.conftest import DEPLOY, Process, require, start_nginx, start_service

NGINX_CONF = (DEPLOY / "nginx" / "nginx.conf").read_text("utf-8")


def test_translate_and_batch_work_through_nginx(nginx: Process) -> None:
    single = httpx.post(
        f"{nginx.url}/translate", json={"text": "Good evening", "target_lang": "de"}, timeout=30
    )
    assert single.status_code == 200, single.text
    assert single.json()["target_lang"] == "de"
    batch = httpx.post(
        f"{nginx.url}/batch_translate",
        json={"texts": ["one", "two", "three"], "target_lang": "fr"},
        timeout=30,
    )
    assert batch.status_code == 200
    assert len(batch.json()["translations"]) == 3
    assert batch.headers["x-request-id"]


def test_repeated_get_is_an_nginx_cache_hit_with_the_same_body(nginx: Process) -> None:
    params = {"text": "Cached through the proxy", "target_lang": "ja", "source_lang": "en"}
    first = httpx.get(f"{nginx.url}/translate", params=params, timeout=30)
    second = httpx.get(f"{nginx.url}/translate", params=params, timeout=30)
    assert first.status_code == second.status_code == 200
    assert first.headers["x-cache-status"] == "MISS"
    assert second.headers["x-cache-status"] == "HIT"
    assert second.content == first.content
    assert first.headers["etag"] == second.headers["etag"]
    assert first.headers["cache-control"].startswith("public, max-age=")
    other = httpx.get(f"{nginx.url}/translate", params={**params, "target_lang": "ko"}, timeout=30)
    assert other.headers["x-cache-status"] == "MISS"
    assert other.json()["target_lang"] == "ko"


def test_get_honours_if_none_match(service: Process) -> None:
    params = {"text": "Conditional", "target_lang": "de"}
    first = httpx.get(f"{service.url}/translate", params=params, timeout=30)
    again = httpx.get(
        f"{service.url}/translate",
        params=params,
        headers={"If-None-Match": first.headers["etag"]},
        timeout=30,
    )
    assert again.status_code == 304
    assert again.content == b""


def test_different_large_posts_never_share_an_answer(nginx: Process, service: Process) -> None:
    # Bodies of ~160 KB: larger than nginx's default 8-16 KB client_body_buffer_size, the case in
    # which a POST cache keyed on $request_body would collide.
    base = ["word " * 600] * 50
    bodies = [
        {"texts": [*base, "alpha " * 10], "target_lang": "de"},
        {"texts": [*base, "beta gamma " * 40], "target_lang": "de"},
    ]
    for body in bodies:
        assert len(str(body)) > 150_000
    proxied = [
        httpx.post(f"{nginx.url}/batch_translate", json=b, timeout=120).json() for b in bodies
    ]
    direct = [
        httpx.post(f"{service.url}/batch_translate", json=b, timeout=120).json() for b in bodies
    ]
    assert all("translations" in p for p in proxied), proxied[0]
    assert proxied == direct
    last_tokens = [p["translations"][-1]["usage"]["input_tokens"] for p in proxied]
    assert last_tokens[0] != last_tokens[1]


def test_metrics_and_docs_are_refused_but_health_is_open(nginx: Process) -> None:
    for path in ("/metrics", "/docs", "/openapi.json", "/redoc"):
        refused = httpx.get(f"{nginx.url}{path}", timeout=10)
        assert refused.status_code == 403, path
        assert refused.json()["error"]["code"] == "forbidden"  # nginx's own, in JSON
    # nginx's own 404 (its internal error location asked for directly) in JSON too; the API's
    # own errors pass in their dialect's shape (DeepL's {"message"}), never replaced.
    assert httpx.get(f"{nginx.url}/_uri_too_long", timeout=10).json()["error"]["code"] == (
        "not_found"
    )
    deepl = httpx.post(f"{nginx.url}/v2/translate", data={"text": "hi"}, timeout=10)
    assert deepl.status_code == 400, deepl.text
    assert "message" in deepl.json()
    health = httpx.get(f"{nginx.url}/health", timeout=10)
    assert health.status_code == 200
    assert health.json()["status"] == "ready"


async def test_a_burst_over_the_rate_limit_gets_429(nginx: Process) -> None:
    async with httpx.AsyncClient(base_url=nginx.url, timeout=30) as client:
        responses = await asyncio.gather(*(client.get("/languages") for _ in range(120)))
    statuses = [r.status_code for r in responses]
    assert statuses.count(429) > 0
    assert set(statuses) <= {200, 429}
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limited"
    assert refused.headers["retry-after"]


@pytest.fixture
def stalled_upstream() -> Iterator[str]:
    """A TCP server that accepts connections and reads requests but never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def test_a_stalled_upstream_gets_nginx_timeout_in_configured_time(
    stalled_upstream: str, tmp_path: Path
) -> None:
    health_timeout = float(
        re.search(r"location = /health \{[^}]*proxy_read_timeout (\d+)s", NGINX_CONF, re.S).group(1)  # type: ignore[union-attr]
    )
    proxy = start_nginx([stalled_upstream], tmp_path / "stalled")
    try:
        began = time.monotonic()
        response = httpx.get(f"{proxy.url}/health", timeout=30)
        elapsed = time.monotonic() - began
    finally:
        proxy.stop()
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert health_timeout - 0.5 <= elapsed <= health_timeout + 2


def test_upstream_keepalive_is_shorter_than_uvicorns() -> None:
    upstream = re.search(r"upstream hymt_api \{(.*?)\}", NGINX_CONF, re.S)
    assert upstream is not None
    idle = re.search(r"keepalive_timeout (\d+)s;", upstream.group(1))
    assert idle is not None
    assert int(idle.group(1)) < Settings(_env_file=None).server.timeout_keep_alive_s


def test_a_worker_may_hold_two_descriptors_per_connection_whatever_its_start_limit(
    tmp_path: Path,
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    connections = re.search(r"worker_connections (\d+);", NGINX_CONF)
    assert connections is not None
    wanted = 2 * int(connections.group(1))
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit ({hard}) is under what a worker needs")
    conf, _ = stack.render_nginx(["127.0.0.1:9"], tmp_path)  # never reached: no request is sent
    command = stack.nginx_command(require("nginx"), conf, tmp_path)

    def low_limit() -> None:  # a host's usual soft limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    nginx = subprocess.Popen(command, preexec_fn=low_limit)
    try:
        deadline = time.monotonic() + 10
        while not (workers := _children(nginx.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for worker in workers:
            limits = Path(f"/proc/{worker}/limits").read_text()
            soft = re.search(r"^Max open files\s+(\d+)", limits, re.MULTILINE)
            assert soft is not None
            assert int(soft.group(1)) >= wanted
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_body_limit_matches_the_service() -> None:
    limit = re.search(r"client_max_body_size (\d+)m;", NGINX_CONF)
    assert limit is not None
    assert int(limit.group(1)) * 1024 * 1024 == Settings(_env_file=None).limits.max_body_bytes


def test_one_request_id_per_answer_the_clients_own_when_sane(nginx: Process) -> None:
    body = {"text": "Request ids", "target_lang": "de"}
    mine = httpx.post(
        f"{nginx.url}/translate", json=body, headers={"X-Request-ID": "trace-42.a"}, timeout=30
    )
    assert mine.headers.get_list("x-request-id") == ["trace-42.a"]
    bad = httpx.post(
        f"{nginx.url}/translate", json=body, headers={"X-Request-ID": "no spaces!"}, timeout=30
    )
    (replaced,) = bad.headers.get_list("x-request-id")
    assert re.fullmatch(r"[0-9a-f]{32}", replaced)
    params = {"text": "Request ids of a cache hit", "target_lang": "de"}
    httpx.get(f"{nginx.url}/translate", params=params, timeout=30)
    hit = httpx.get(
        f"{nginx.url}/translate", params=params, headers={"X-Request-ID": "second"}, timeout=30
    )
    assert hit.headers["x-cache-status"] == "HIT"
    assert hit.headers.get_list("x-request-id") == ["second"]  # not the stored answer's


def test_the_access_log_is_json_without_query_strings(nginx: Process) -> None:
    params = {"text": "SecretUserText", "target_lang": "de", "auth_key": "SecretKey"}
    answer = httpx.get(
        f"{nginx.url}/translate", params=params, headers={"X-Request-ID": "logged-1"}, timeout=30
    )
    assert answer.status_code == 200
    log = Path(nginx.log).parent / "access.log"
    deadline = time.monotonic() + 5
    line = ""
    while time.monotonic() < deadline and '"logged-1"' not in line:
        lines = [ln for ln in log.read_text().splitlines() if '"logged-1"' in ln]
        line = lines[-1] if lines else ""
        time.sleep(0.05)
    entry = json.loads(line)
    assert entry["path"] == "/translate"
    assert entry["status"] == 200
    assert entry["request_id"] == "logged-1"
    assert "Secret" not in line


@pytest.fixture(scope="module")
def limited(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A service with a per-client rate limit that believes forwarded headers from 127.0.0.1."""
    folder = tmp_path_factory.mktemp("limited")
    process = start_service(
        data_dir,
        folder / "service.log",
        HYMT_RATE_LIMIT="3/minute",
        HYMT_TRUSTED_PROXIES='["127.0.0.1"]',
    )
    yield process
    process.stop()


def client_from(address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 on loopback)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def statuses(client: httpx.Client, url: str, spoof: bool = False) -> list[int]:
    answers = []
    for index in range(4):
        headers = {"X-Forwarded-For": f"10.0.{index}.{index + 1}"} if spoof else {}
        answer = client.post(
            f"{url}/translate", json={"text": "Rate", "target_lang": "de"}, headers=headers
        )
        answers.append(answer.status_code)
    return answers


def test_each_client_has_its_own_bucket_and_cannot_pick_another(
    limited: Process, tmp_path_factory: pytest.TempPathFactory
) -> None:
    proxy = start_nginx([limited.url.removeprefix("http://")], tmp_path_factory.mktemp("nginx-rl"))
    try:
        # Through nginx: two clients, two buckets of 3.
        for address in ("127.0.0.2", "127.0.0.3"):
            with client_from(address) as client:
                assert statuses(client, proxy.url) == [200, 200, 200, 429], address
        # A new spoofed X-Forwarded-For per request gets nothing more through nginx...
        with client_from("127.0.0.4") as client:
            assert statuses(client, proxy.url, spoof=True) == [200, 200, 200, 429]
        # ...nor directly: the service believes the header from 127.0.0.1 only.
        with client_from("127.0.0.5") as client:
            assert statuses(client, limited.url, spoof=True) == [200, 200, 200, 429]
    finally:
        proxy.stop()


def test_the_page_is_revalidated_its_files_cached_and_uploads_pass(nginx: Process) -> None:
    page = httpx.get(f"{nginx.url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    assert 'label for="text">Text to translate<' in page.text
    first = httpx.get(f"{nginx.url}/static/app.js")
    second = httpx.get(f"{nginx.url}/static/app.js")
    assert first.status_code == second.status_code == 200
    assert first.headers["cache-control"] == "public, max-age=3600"
    assert second.headers["x-cache-status"] == "HIT"
    assert httpx.get(f"{nginx.url}/static/missing.js").status_code == 404
    # A 3 MB document passes nginx's upload location (1 MiB is the limit elsewhere); mostly
    # blank, so its translation is two lines.
    text = b"Hello.\n" + b"\n" * 3_000_000 + b"Goodbye.\n"
    upload = httpx.post(
        f"{nginx.url}/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("long.txt", text)},
        timeout=60,
    )
    assert upload.status_code == 200, upload.text
    assert upload.json()["document_id"]
    too_big = httpx.post(
        f"{nginx.url}/v2/document",
        data={"target_lang": "DE"},
        files={"file": ("huge.txt", b"x" * (12 * 1024 * 1024))},
        timeout=60,
    )
    assert too_big.status_code == 413


def test_a_limit_req_storm_logs_no_key_and_no_text(nginx: Process) -> None:
    """Issue 34, finding 6: rejections were logged at error level with the request line."""
    url = f"{nginx.url}/v2/translate?auth_key=StormKey&text=StormText&target_lang=DE"
    with httpx.Client(timeout=30) as client:
        token = client.get(f"{nginx.url}/libretranslate/download_file/TokenSecret.k/a.txt")
        statuses = [client.get(url).status_code for _ in range(120)]
    assert token.status_code == 404
    assert 429 in statuses
    time.sleep(0.5)  # nginx writes its logs as it goes; give the last lines a moment
    folder = Path(nginx.log).parent
    logs = [folder / "access.log", folder / "error.log", Path(nginx.log)]
    for log in logs:
        text = log.read_text() if log.exists() else ""
        for secret in ("StormKey", "StormText", "TokenSecret"):
            assert secret not in text, (log, secret)
    assert "/libretranslate/download_file/[token]" in (folder / "access.log").read_text()


def test_a_result_with_a_huge_file_name_downloads_through_nginx(nginx: Process) -> None:
    """Issue 34: a 6,004-character file name made a header nginx refused, after the one-time
    result had been marked downloaded. The name given back is the upload's last path part, cut."""
    name = "../" + "n" * 6000 + ".txt"
    upload = httpx.post(
        f"{nginx.url}/libretranslate/translate_file",
        data={"source": "en", "target": "de", "filename": name},
        files={"file": ("short.txt", b"Hello there.")},
        timeout=120,
    )
    assert upload.status_code == 200, upload.text
    link = upload.json()["translatedFileUrl"]
    assert link.startswith(f"{nginx.url}/libretranslate/")  # the port kept (issue 34)
    result = httpx.get(link, timeout=30)
    assert result.status_code == 200
    disposition = result.headers["content-disposition"]
    assert len(disposition) < 300
    assert ".." not in disposition


def test_nginx_answers_carry_one_nosniff(nginx: Process) -> None:
    """Its own answers (403 for /metrics) and the API's alike, the header once."""
    for path in ("/metrics", "/health", "/languages"):
        answer = httpx.get(f"{nginx.url}{path}", timeout=30)
        assert answer.headers.get_list("x-content-type-options") == ["nosniff"], path


# Requests nginx itself cannot take, each as raw bytes: a request line over its buffers, a
# header over them, a header line without a colon, two Content-Lengths, a method it refuses, a
# transfer coding it does not know.
UNPARSABLE = {
    "uri": (b"GET /translate?text=" + b"a" * 20000 + b"&target_lang=de HTTP/1.1\r\nHost: x", 414),
    "header": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 20000, 400),
    "header line": (b"GET /health HTTP/1.1\r\nHost: x\r\nNo colon here", 400),
    "lengths": (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3",
                400),
    "method": (b"TRACE / HTTP/1.1\r\nHost: x", 405),
    "coding": (b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: foo", 501),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(UNPARSABLE))
def test_what_nginx_cannot_parse_is_answered_in_json(nginx: Process, case: str) -> None:
    """nginx's own HTML pages were the answer (text/html) to each of these."""
    head, status = UNPARSABLE[case]
    host, port = nginx.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    header, _, body = answer.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    assert lines[0].split()[1] == str(status), lines[0]
    fields = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:]}
    assert fields["content-type"] == "application/json", fields
    assert json.loads(body)["error"]["code"]


# What a client of each API reads an error's message from.
_SHAPES: dict[str, Callable[[Any], str]] = {
    "/translate": lambda b: b["error"]["message"],
    "/v2/translate": lambda b: b["message"],
    "/v3/glossaries": lambda b: b["message"],
    "/libretranslate/translate": lambda b: b["error"],
    "/language/translate/v2": lambda b: b["error"]["errors"][0]["message"],
    "/v3/projects/p:translateText": lambda b: b["error"]["message"],
    "/v1/chat/completions": lambda b: b["error"]["message"],
}


@pytest.mark.parametrize("path", sorted(_SHAPES))
def test_nginx_s_own_413_comes_in_the_shape_of_the_path_s_api(nginx: Process, path: str) -> None:
    """Every error nginx answered itself was in the native shape, whatever API the path spoke."""
    response = httpx.post(
        f"{nginx.url}{path}",
        content=b'{"q": "' + b"x" * (2 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/json"
    assert "request body over the limit" in _SHAPES[path](response.json())
    if path == "/translate":
        assert response.json()["error"]["code"] == "payload_too_large"


async def test_nginx_s_own_429_comes_in_each_api_s_shape(nginx: Process) -> None:
    paths = ("/libretranslate/languages", "/v2/languages", "/language/translate/v2/languages")
    async with httpx.AsyncClient(base_url=nginx.url, timeout=30) as client:
        responses = await asyncio.gather(*(client.get(p) for p in paths for _ in range(60)))
    refused = {str(r.url.path): r.json() for r in responses if r.status_code == 429}
    assert refused, "no request was refused"
    for path, body in refused.items():
        if path.startswith("/libretranslate"):
            assert body["error"].startswith("Slowdown: ")
        elif path.startswith("/v2"):
            assert body["message"] == "too many requests from this client"
        else:
            assert body["error"]["status"] == "RESOURCE_EXHAUSTED"
