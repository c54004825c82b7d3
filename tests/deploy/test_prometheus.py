"""The shipped Prometheus config, run by the real Prometheus, scraping the real service."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.deploy.conftest import DEPLOY, Process, free_port, require, wait_until


def test_prometheus_scrapes_the_service(service: Process, tmp_path: Path) -> None:
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text("utf-8")
    config = config.replace("api:8000", service.url.removeprefix("http://"))
    (tmp_path / "prometheus.yml").write_text(config, "utf-8")
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [
                require("prometheus"),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(f"http://127.0.0.1:{port}/-/ready", timeout_s=60)
        deadline = time.monotonic() + 60
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline and not result:
            answer = httpx.get(
                f"http://127.0.0.1:{port}/api/v1/query", params={"query": "hymt_ready"}, timeout=5
            ).json()
            result = answer["data"]["result"]
            time.sleep(0.5)
        assert result, log.read_text()
        assert result[0]["value"][1] == "1"  # type: ignore[index]
        assert result[0]["metric"]["job"] == "hunyuan-mt"  # type: ignore[index]
        rules = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()
        names = {rule["name"] for group in rules["data"]["groups"] for rule in group["rules"]}
        assert {"HymtEngineDown", "HymtQueueSaturated", "HymtErrorRate"} <= names
    finally:
        popen.terminate()
        popen.wait(timeout=30)


def test_the_alert_rules_pass_promtool() -> None:
    """The shipped rules are valid and each fires on the series that should fire it."""
    folder = DEPLOY / "prometheus"
    promtool = require("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", "alerts.yml"], cwd=folder, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "alerts.test.yml"], cwd=folder, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    config = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"], cwd=folder, capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
