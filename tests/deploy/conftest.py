"""Real processes on loopback: the service (python -m service), nginx and Prometheus.

The shipped configs are used as they are, with only listen ports, upstream addresses and
filesystem paths substituted.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin")
    if found is None:
        pytest.fail(f"{binary} is not installed: run `make system-deps` (Debian package)")
    return found


@dataclass
class Process:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_service(data_dir: Path, log: Path, **env: str) -> Process:
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


def render_nginx(upstream: str, folder: Path) -> tuple[Path, int]:
    port = free_port()
    text = (DEPLOY / "nginx" / "nginx.conf").read_text("utf-8")
    text = text.replace("server api:8000", f"server {upstream}")
    text = text.replace("listen 80;", f"listen 127.0.0.1:{port};")
    text = text.replace("/var/cache/nginx/hymt", str(folder / "cache"))
    text = re.sub(r"access_log \S+( \w+)?;", rf"access_log {folder / 'access.log'}\1;", text)
    conf = folder / "nginx.conf"
    conf.write_text(text, "utf-8")
    return conf, port


def nginx_command(conf: Path, folder: Path) -> list[str]:
    return [
        require("nginx"),
        "-p",
        str(folder),
        "-c",
        str(conf),
        "-e",
        str(folder / "error.log"),
        "-g",
        # As root, nginx's workers run as nobody, who cannot enter pytest's private temp folders.
        f"daemon off; pid {folder / 'nginx.pid'};" + (" user root;" if os.geteuid() == 0 else ""),
    ]


def start_nginx(upstream: str, folder: Path) -> Process:
    folder.mkdir(parents=True, exist_ok=True)
    conf, port = render_nginx(upstream, folder)
    test = subprocess.run(
        [*nginx_command(conf, folder), "-t"], capture_output=True, text=True, check=False
    )
    assert test.returncode == 0, test.stderr
    log = folder / "nginx.out"
    with log.open("wb") as out:
        popen = subprocess.Popen(nginx_command(conf, folder), stdout=out, stderr=subprocess.STDOUT)
    process = Process(popen, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.05)
    process.stop()
    raise AssertionError(log.read_text())


@pytest.fixture(scope="session")
def nginx(service: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    process = start_nginx(service.url.removeprefix("http://"), tmp_path_factory.mktemp("nginx"))
    yield process
    process.stop()
