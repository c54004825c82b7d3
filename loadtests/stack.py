"""The deployment's own nginx and Redis, started on loopback for benchmarks and the deploy tests.

nginx runs the shipped ``deploy/nginx/nginx.conf`` with only its listen port, its upstream
servers and filesystem paths substituted; Redis runs as ``deploy/compose.replicas.yaml`` runs it
(no persistence). Binaries are found on ``PATH`` (and ``/usr/sbin``, where Debian puts nginx) or
given explicitly, as on a GPU machine that carries them unpacked from Debian's packages.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NGINX_CONF = ROOT / "deploy" / "nginx" / "nginx.conf"
# What each upstream server line of the shipped config carries besides its address.
UPSTREAM_OPTIONS = "max_fails=3 fail_timeout=10s"
# nginx's temporary folders default to paths compiled into the binary (/var/lib/nginx on Debian),
# which a binary unpacked from its package on another machine does not have.
_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


@dataclass
class Process:
    """A child process serving at ``url``, its output in ``log``."""

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


def render_nginx(upstreams: Sequence[str], folder: Path) -> tuple[Path, int]:
    """The shipped config with ``upstreams`` (``host:port`` each) as its servers, listening on
    a free loopback port, its cache, logs and temporary files under ``folder``."""
    if not upstreams:
        raise ValueError("nginx needs at least one upstream server")
    port = free_port()
    text = NGINX_CONF.read_text("utf-8")
    servers = f" {UPSTREAM_OPTIONS};\n        server ".join(upstreams)
    text = text.replace(
        f"server api:8000 {UPSTREAM_OPTIONS}", f"server {servers} {UPSTREAM_OPTIONS}"
    )
    text = text.replace("listen 80;", f"listen 127.0.0.1:{port};")
    text = text.replace("/var/cache/nginx/hymt", str(folder / "cache"))
    text = re.sub(r"access_log \S+( \w+)?;", rf"access_log {folder / 'access.log'}\1;", text)
    temp = "".join(f"\n    {kind}_temp_path {folder / kind};" for kind in _TEMP_PATHS)
    text = text.replace("http {", "http {" + temp, 1)
    conf = folder / "nginx.conf"
    conf.write_text(text, "utf-8")
    return conf, port


def nginx_command(binary: str, conf: Path, folder: Path) -> list[str]:
    return [
        binary,
        "-p",
        str(folder),
        "-c",
        str(conf),
        "-e",
        str(folder / "error.log"),
        "-g",
        # As root, nginx's workers run as nobody, who cannot enter private temp folders.
        f"daemon off; pid {folder / 'nginx.pid'};" + (" user root;" if os.geteuid() == 0 else ""),
    ]


def _wait_for_port(port: int, process: Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.popen.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    process.stop()
    raise RuntimeError(f"{process.popen.args!r} did not start: {process.log.read_text()[-2000:]}")


def start_nginx(binary: str, upstreams: Sequence[str], folder: Path) -> Process:
    """The shipped nginx in front of ``upstreams``, checked with ``nginx -t`` first."""
    folder.mkdir(parents=True, exist_ok=True)
    conf, port = render_nginx(upstreams, folder)
    command = nginx_command(binary, conf, folder)
    test = subprocess.run([*command, "-t"], capture_output=True, text=True, check=False)
    if test.returncode != 0:
        raise RuntimeError(f"nginx -t failed: {test.stderr}")
    log = folder / "nginx.out"
    with log.open("wb") as out:
        popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    process = Process(popen, f"http://127.0.0.1:{port}", log)
    _wait_for_port(port, process, 10)
    return process


def redis_ping(port: int) -> bool:
    """Whether a Redis server answers PING on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(binary: str, port: int, folder: Path) -> Process:
    """Redis on loopback ``port`` without persistence, answering PING."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"redis-{port}.out"
    command = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(folder),
    ]  # fmt: skip
    with log.open("wb") as out:
        popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    process = Process(popen, f"redis://127.0.0.1:{port}/0", log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and popen.poll() is None:
        if redis_ping(port):
            return process
        time.sleep(0.05)
    process.stop()
    raise RuntimeError(f"redis-server did not start: {log.read_text()[-2000:]}")
