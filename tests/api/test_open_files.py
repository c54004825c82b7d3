"""An API process's open files: the soft limit raised, the kernel's table grown at start."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.frontend import server
from service.frontend.open_files import OpenFiles, reserve_open_files
from tests.conftest import MakeSettings


def table_entries() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^FDSize:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]


def test_a_low_soft_limit_is_raised_and_the_table_grown_in_a_threaded_process() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    # A fresh process with the soft limit many hosts start with and a thread running (as an
    # API process has): its table starts small.
    script = textwrap.dedent(
        f"""
        import resource, threading, time
        from service.frontend.open_files import reserve_open_files
        from tests.api.test_open_files import table_entries
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        threading.Thread(target=time.sleep, args=(1,), daemon=True).start()
        before = table_entries()
        files = reserve_open_files({wanted})
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(before, table_entries(), soft, files.limit, files.table)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, soft, limit, table = map(int, done.stdout.split())
    assert before < wanted
    assert after >= wanted
    assert soft == limit == wanted
    assert table == wanted


@settings(max_examples=25, deadline=None)
@given(wanted=st.integers(min_value=1, max_value=2048), offset=st.integers(0, 64))
def test_an_open_descriptor_is_never_touched_and_the_limit_never_lowered(
    wanted: int, offset: int
) -> None:
    soft_before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # A descriptor open right where the table's growth would land, or near it.
    probe = os.open(os.devnull, os.O_RDONLY)
    near = min(max(wanted - 1 + offset - 32, 3), soft_before - 1)
    held = fcntl.fcntl(probe, fcntl.F_DUPFD, near)  # the lowest free one from there
    try:
        stat = os.fstat(held)
        files = reserve_open_files(wanted)
        assert os.fstat(held) == stat  # still open, still the same file
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft_before
        assert files.table == min(wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        assert table_entries() >= files.table
    finally:
        os.close(held)
        os.close(probe)


def test_a_system_that_refuses_the_raise_keeps_its_limit_and_still_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # macOS caps open files under an unlimited hard limit: setrlimit raises ValueError there.
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no soft limit to raise")

    def refuse(*args: object) -> None:
        raise ValueError("current limit exceeds maximum limit")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    files = reserve_open_files(soft + 1000)
    assert files.limit == soft
    assert files.table == soft


@pytest.mark.parametrize("asked", [None, 4096])
def test_a_shortfall_is_a_warning_only_when_the_operator_asked(
    asked: int | None,
    make_settings: MakeSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings() if asked is None else make_settings(open_files=asked)
    monkeypatch.setattr(server, "reserve_open_files", lambda wanted: OpenFiles(256, 256))
    with caplog.at_level(logging.INFO, logger=server.__name__):
        server.reserve_files(settings)
    [record] = [r for r in caplog.records if "open files" in r.getMessage()]
    # Unset, the system allowing fewer is no fault (macOS); asked for, the operator must know.
    assert record.levelno == (logging.INFO if asked is None else logging.WARNING)
