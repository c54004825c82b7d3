"""Two replicas of the service behind the real nginx, sharing a real Redis (Debian's
``redis-server``): a client spread over both gets exactly its quota, a translation made through
one is a cache hit through the other, Redis stopped and started under load costs no 5xx (local
limits and cache meanwhile, said in /health and a metric), and a replica killed under load loses
no request it had not received."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests import replicas
from loadtests.stack import start_redis
from tests.deploy.conftest import Process, free_port, require, start_nginx, start_service

# Ten keys for the wait for Redis to come back: at most 75 requests in its 15 s, 12 per key.
BACK_KEYS = [f"back-key-{n}" for n in range(10)]
KEYS = ["quota-key", "cache-key", "redis-key", "kill-key", *BACK_KEYS]


def _start_redis(port: int, folder: Path) -> Process:
    return start_redis(require("redis-server"), port, folder)


@pytest.fixture
def cluster(data_dir: Path, tmp_path: Path) -> Iterator[tuple[list[Process], Process, int]]:
    redis_port = free_port()
    redis = _start_redis(redis_port, tmp_path)
    env = {
        "HYMT_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "HYMT_API_KEYS": json.dumps(KEYS),
        "HYMT_CHAR_QUOTA": "300/hour",
    }
    replicas = [start_service(data_dir, tmp_path / f"replica{n}.log", **env) for n in range(2)]
    addresses = [replica.url.removeprefix("http://") for replica in replicas]
    nginx = start_nginx(addresses, tmp_path / "nginx")
    try:
        yield replicas, nginx, redis_port
    finally:
        nginx.stop()
        for replica in replicas:
            replica.stop()
        redis.stop()


def _post(url: str, key: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/translate",
        json={"text": text, "target_lang": "de", "source_lang": "en"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_replicas_share_quota_and_cache_and_survive_redis_and_a_replica_going(
    cluster: tuple[list[Process], Process, int], tmp_path: Path
) -> None:
    (a, b), nginx, redis_port = cluster
    # 12 texts of 30 characters, alternating replicas: 10 fit in the shared quota of 300.
    statuses = [
        _post((a, b)[n % 2].url, "quota-key", f"Text number {n:02d} for the quota").status_code
        for n in range(12)
    ]
    assert statuses == [200] * 10 + [429] * 2

    # Made through one replica, a hit through the other.
    first = _post(a.url, "cache-key", "The shared cache works across replicas.")
    assert first.headers["x-cache"] == "miss"
    second = _post(b.url, "cache-key", "The shared cache works across replicas.")
    assert second.headers["x-cache"] == "hit"
    assert second.json()["translation"] == first.json()["translation"]
    assert _metric(b.url, "hymt_shared_cache_hits_total") == 1.0
    assert httpx.get(f"{a.url}/health").json()["shared_state"] == "up"

    # Redis stopped under load, then started again: no 5xx at any time.
    cli = [require("redis-cli"), "-p", str(redis_port)]
    outcomes: list[int] = []
    subprocess.run([*cli, "shutdown", "nosave"], capture_output=True)
    for n in range(20):
        outcomes.append(_post(nginx.url, "redis-key", f"Redis is away {n}.").status_code)
        time.sleep(0.05)
    assert outcomes == [200] * 20
    assert {httpx.get(f"{r.url}/health").json()["shared_state"] for r in (a, b)} == {"down"}
    assert _metric(a.url, "hymt_redis_up") == 0.0
    restarted = _start_redis(redis_port, tmp_path)
    try:
        deadline = time.monotonic() + 15
        # Keys in turn: how long the replicas take to notice Redis is back varies with the
        # machine's load, and one key's 300-character quota could run out meanwhile.
        for n in itertools.count():
            key = BACK_KEYS[n % len(BACK_KEYS)]
            outcome = _post(nginx.url, key, f"Redis is back {time.monotonic():.1f}.")
            assert outcome.status_code == 200
            states = {httpx.get(f"{r.url}/health").json()["shared_state"] for r in (a, b)}
            if states == {"up"}:
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        assert _metric(a.url, "hymt_redis_up") == 1.0

        # A replica killed under load: requests sent after it died all succeed elsewhere.
        results: list[tuple[float, int]] = []
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    status = _post(nginx.url, "kill-key", f"Kill {n}.").status_code
                except httpx.HTTPError:
                    status = 0
                results.append((sent, status))
                n += 1
                time.sleep(0.06)  # under nginx's 20 requests/s per client

        thread = threading.Thread(target=load)
        thread.start()
        time.sleep(1.0)
        b.popen.kill()
        killed = time.monotonic()
        b.popen.wait()
        time.sleep(2.0)
        stop.set()
        thread.join()
        after = [status for sent, status in results if sent > killed]
        assert after
        assert set(after) == {200}, results
        before = [status for sent, status in results if sent <= killed]
        assert before.count(200) >= len(before) - 1  # at most the one inside b when it died
    finally:
        restarted.stop()


def test_the_replicas_benchmark_measures_both_phases_through_nginx(
    data_dir: Path, tmp_path: Path
) -> None:
    """``loadtests.replicas`` (the two-GPU measurement's harness), on the demo model: two
    replicas then one behind the real nginx and Redis, clients from several addresses."""
    result = replicas.main(
        ["--out", str(tmp_path), "--replicas", "2", "--requests", "24", "--concurrency", "8",
         "--sources", "4", "--flood-requests", "64", "--nginx", require("nginx"),
         "--redis-server", require("redis-server"), "--env", f"HYMT_DATA_DIR={data_dir}",
         "--env", "HYMT_MAX_NEW_TOKENS=4", "--env", "HYMT_GREEDY=true",
         "--env", "HYMT_MAX_QUEUE_SIZE=8"]
    )  # fmt: skip
    assert json.loads((tmp_path / "replicas.json").read_text()) == result
    both, one = result["all"], result["one"]
    for part in (both, one):
        assert part["throughput"]["ok"] == 24  # no 429 from nginx: 4 addresses, 8 clients
        # The flood passes nginx's per-address limit and meets the service's queue bound.
        assert part["flood"]["lost"] == 0
        assert part["flood"]["by_status"].get("429", 0) > 0
        assert part["flood"]["health_not_200"] == {}
    # 24 measured + 8 warm-up requests, every one generated (the result cache is off).
    assert sum(r["requests"] for r in both["served"]) == 32
    assert all(r["generated_tokens"] > 0 for r in both["served"])  # both replicas served
    assert sum(r["share_of_requests"] for r in both["served"]) == pytest.approx(1.0, abs=1e-3)
    assert [r["share_of_requests"] for r in one["served"]] == [1.0]
    assert result["ratio_all_over_one"] > 0
