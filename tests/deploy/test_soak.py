"""A bounded soak: a steady open-loop rate on the demo model for a few minutes.

Zero errors, and resident memory growth after warm-up under 50 MB; the figures are printed in the
test output (pytest -s, or the CI log's captured stdout on failure).
"""

from __future__ import annotations

import os
from pathlib import Path

from loadtests import loadgen
from tests.deploy.conftest import start_service

# 45 s keeps the suite near its 10-minute budget; set HYMT_SOAK_SECONDS for a longer soak.
SOAK_SECONDS = float(os.environ.get("HYMT_SOAK_SECONDS", "45"))
RATE = 20.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_soak_has_no_errors_and_bounded_memory(data_dir: Path, tmp_path: Path) -> None:
    service = start_service(data_dir, tmp_path / "service.log", HYMT_MAX_QUEUE_SIZE="4096")
    try:
        pid = service.popen.pid
        warm = await loadgen.run(
            loadgen.parser().parse_args(
                ["--url", service.url, "--mode", "open", "--rate", str(RATE), "--requests",
                 "120", "--warmup", "0", "--quiet", "--seed", "11"]
            )
        )  # fmt: skip
        assert warm.ok == warm.requests
        before = rss_bytes(pid)
        report = await loadgen.run(
            loadgen.parser().parse_args(
                ["--url", service.url, "--mode", "open", "--rate", str(RATE), "--requests",
                 str(int(RATE * SOAK_SECONDS)), "--duration", str(SOAK_SECONDS + 30),
                 "--warmup", "0", "--quiet", "--seed", "12"]
            )
        )  # fmt: skip
        after = rss_bytes(pid)
    finally:
        service.stop()
    growth_mb = (after - before) / 1e6
    print(
        f"\nsoak: {report.requests} requests in {report.duration_s} s at {RATE}/s, "
        f"{report.ok} ok, errors {report.errors_by_status}, p99 {report.latency_p99_s} s; "
        f"RSS after warm-up {before / 1e6:.1f} MB, at end {after / 1e6:.1f} MB, "
        f"growth {growth_mb:.1f} MB"
    )
    assert report.errors_by_status == {}
    assert report.ok == report.requests == int(RATE * SOAK_SECONDS)
    assert growth_mb < 50
