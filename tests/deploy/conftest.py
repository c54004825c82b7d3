"""Real processes on loopback: the service (python -m service), nginx and Prometheus.

The shipped configs are used as they are, with only listen ports, upstream addresses and
filesystem paths substituted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from loadtests import stack

# Re-exported: the deploy tests take every real process's helpers from here.
from loadtests.stack import Process as Process
from loadtests.stack import free_port as free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def wait_until(url: str, timeout_s: float, status: int = 200) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2).status_code
            if last == status:
                return
        except httpx.HTTPError as error:
            last = error
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer {status} in {timeout_s} s (last: {last})")


def require(binary: str) -> str:
    found = stack.find_binary(binary)
    if found is None:
        pytest.fail(f"{binary} is not installed: run `make system-deps` (Debian package)")
    return found


def start_service(data_dir: Path, log: Path, **env: str) -> Process:
    """``python -m service`` on a free port with ``env``."""
    return _start(data_dir, log, env, own_group=False)


def start_service_in_group(data_dir: Path, log: Path, **env: str) -> Process:
    """The same, in a process group of its own (a test may then signal the whole group)."""
    return _start(data_dir, log, env, own_group=True)


def _start(data_dir: Path, log: Path, env: dict[str, str], own_group: bool) -> Process:
    port = free_port()
    environment = {
        **os.environ,
        "HYMT_DATA_DIR": str(data_dir),
        "HYMT_HOST": "127.0.0.1",
        "HYMT_PORT": str(port),
        "HYMT_GREEDY": "true",
        # Short generations: these tests are about the HTTP stack, not the model.
        "HYMT_MAX_NEW_TOKENS": "8",
        **env,
    }
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "service"],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
            start_new_session=own_group,
        )
    process = Process(popen, f"http://127.0.0.1:{port}", log)
    try:
        wait_until(f"{process.url}/health", timeout_s=120)
    except TimeoutError:
        process.stop()
        raise AssertionError(log.read_text()) from None
    return process


@pytest.fixture(scope="session")
def service(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    process = start_service(data_dir, tmp_path_factory.mktemp("service") / "service.log")
    yield process
    process.stop()


def start_nginx(upstreams: Sequence[str], folder: Path) -> Process:
    """The shipped nginx in front of ``upstreams`` (``host:port`` each)."""
    return stack.start_nginx(require("nginx"), upstreams, folder)


@pytest.fixture(scope="session")
def nginx(service: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    process = start_nginx([service.url.removeprefix("http://")], tmp_path_factory.mktemp("nginx"))
    yield process
    process.stop()
