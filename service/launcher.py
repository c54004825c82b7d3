"""Several API processes in front of one engine process (``HYMT_API_PROCESSES`` > 1).

One event loop answers HTTP requests one after another; a flood of thousands waits for its turn
even when each is only turned away. So the launcher (``python -m service``) starts that many API
processes (multiprocessing spawn), each listening on the same port with SO_REUSEPORT, so that the
kernel spreads connections evenly over them:

- process 0 is the **leader**: it starts and supervises the engine process as a lone API
  process would, and has the engine serve the followers' sockets as well;
- the others are **followers** (``policy.following``): they reach the leader's engine
  over their own ZeroMQ sockets and follow it through restarts. A follower listens only once it
  and the leader serve: while the model loads only the leader answers (``/live`` 200,
  ``/health`` 503), and the first ``/health`` 200 comes from a group whose every listening
  process serves.

Each admits its share of ``max_queue_size`` and keeps its own result cache and preparation
workers. Metrics are recorded in prometheus-client's multiprocess mode, so ``/metrics`` of any
process adds up all of them.

The launcher only watches: a follower that dies is started again (at most ``_MAX_RESPAWNS``
times in ``_RESPAWN_WINDOW_S``); the leader's end ends the group with the leader's status (its
engine went with it). SIGTERM or SIGINT is passed to every API process as SIGTERM: each drains
what it holds, and the leader stops the engine only once every follower has exited (they send
it work until then). A second signal is passed on as well, and stops them at once. Signals are
for the launcher alone (PID 1 in a container): the API processes ignore SIGINT, so that a
terminal's Ctrl-C, sent to the whole process group, is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType

from fastapi import FastAPI
from prometheus_client import multiprocess

from service.config.settings import Settings
from service.contract.protocol import Peer
from service.frontend.metrics import Metrics
from service.frontend.server import serve, shared_port_socket
from service.logs import configure_logging
from service.wiring import create_service

log = logging.getLogger(__name__)

# prometheus-client reads this once, when it is imported: it must be set before the API
# processes start (they inherit the launcher's environment).
_METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_MAX_RESPAWNS = 5
_RESPAWN_WINDOW_S = 600.0
_RESPAWN_DELAY_S = 1.0
# Beyond the drain timeout: how long stopping processes get before they are killed.
_STOP_GRACE_S = 15.0
_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Member:
    """What one API process of the group is: the leader (index 0, serving ``peers``, the
    followers' sockets) or a follower (``peers`` holds its own sockets alone)."""

    index: int
    peers: tuple[Peer, ...]
    metrics_dir: Path
    # The group's rate and quota counters (``frontend.local_limits``).
    limits_file: Path

    @property
    def leads(self) -> bool:
        return self.index == 0


def run_member(
    settings: Settings, member: Member, leader_serving: Event, followers_gone: Event
) -> None:
    """The body of one API process (runs in the spawned child)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(settings.observability.log_level, process=f"api-{member.index}")
    parent = multiprocessing.parent_process()
    timeout_s = settings.reliability.drain_timeout_s + _STOP_GRACE_S

    async def wait_followers() -> None:
        # The followers send work to the engine until they have drained and exited.
        if not await asyncio.to_thread(followers_gone.wait, timeout_s):
            log.warning("followers still running; stopping the engine anyway")

    async def wait_leader() -> None:
        # A multiprocessing event, polled: waited on in a thread, a wait that never ends would
        # hold up the process's exit.
        while not leader_serving.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    def make_app(on_fatal: Callable[[], None]) -> FastAPI:
        metrics = Metrics(shared_dir=member.metrics_dir)
        if member.leads:
            return create_service(
                settings,
                metrics=metrics,
                on_fatal=on_fatal,
                tune_gc=True,
                followers=member.peers,
                before_engine_stop=wait_followers,
                on_serving=leader_serving.set,
                limits_file=member.limits_file,
            )
        return create_service(
            settings,
            metrics=metrics,
            on_fatal=on_fatal,
            tune_gc=True,
            follow=member.peers[0],
            before_listening=wait_leader,
            limits_file=member.limits_file,
        )

    sys.exit(
        serve(
            settings,
            make_app,
            sockets=[shared_port_socket(settings)],
            signals=(signal.SIGTERM,),
            parent_sentinel=parent.sentinel if parent is not None else None,
        )
    )


class Launcher:
    """Starts the group of API processes, watches it, and passes signals on."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._folder = Path(tempfile.mkdtemp(prefix="hymt-api-"))
        self._metrics_dir = self._folder / "metrics"
        self._metrics_dir.mkdir()
        count = settings.server.processes
        self._peers = tuple(
            (f"ipc://{self._folder}/api-{i}-requests", f"ipc://{self._folder}/api-{i}-results")
            for i in range(1, count)
        )
        self._leader_serving = self._context.Event()
        self._followers_gone = self._context.Event()
        self._processes: dict[int, SpawnProcess] = {}
        self._respawns: deque[float] = deque()
        self._signals: list[int] = []

    def run(self) -> int:
        """Run the group until it stops; the leader's exit status (1 if it could not start)."""
        os.environ[_METRICS_DIR_VARIABLE] = str(self._metrics_dir)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signalled)
        try:
            for index in range(self._settings.server.processes):
                self._start(index)
            log.info(
                "API processes started",
                extra={
                    "processes": self._settings.server.processes,
                    "port": self._settings.server.port,
                },
            )
            return self._watch()
        finally:
            for process in self._processes.values():
                if process.is_alive():
                    process.kill()
                process.join(5)
            shutil.rmtree(self._folder, ignore_errors=True)

    def _member(self, index: int) -> Member:
        peers = self._peers if index == 0 else (self._peers[index - 1],)
        return Member(index, peers, self._metrics_dir, self._folder / "limits.sqlite3")

    def _start(self, index: int) -> None:
        process = self._context.Process(
            target=run_member,
            args=(
                self._settings,
                self._member(index),
                self._leader_serving,
                self._followers_gone,
            ),
            name=f"hymt-api-{index}",
        )
        process.start()
        self._processes[index] = process

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _watch(self) -> int:
        stopping_since: float | None = None
        killed = False
        passed_on = 0
        while True:
            if len(self._signals) > passed_on:
                passed_on = len(self._signals)
                if stopping_since is None:
                    stopping_since = time.monotonic()
                    log.info("stopping", extra={"signal": signal.Signals(self._signals[0]).name})
                self._signal_all(signal.SIGTERM)
            # The live ones only: an ended leader's sentinel stays ready, and would turn this
            # loop at once while its followers drain.
            sentinels = [p.sentinel for p in self._processes.values() if p.is_alive()]
            multiprocessing.connection.wait(sentinels, timeout=_POLL_S)
            leader = self._processes[0]
            for index, process in list(self._processes.items()):
                if index == 0 or process.is_alive():
                    continue
                self._reap(process)
                del self._processes[index]
                if stopping_since is None and leader.is_alive():
                    if not self._may_respawn():
                        log.error("API processes keep dying; stopping the group")
                        stopping_since = time.monotonic()
                        self._signals.append(signal.SIGTERM)
                        continue
                    log.error(
                        "an API process died; starting it again",
                        extra={"index": index, "exitcode": process.exitcode},
                    )
                    time.sleep(_RESPAWN_DELAY_S)
                    self._start(index)
            if stopping_since is not None and len(self._processes) == 1:
                self._followers_gone.set()
            if not leader.is_alive():
                if stopping_since is None:
                    self._reap(leader)
                    log.error("the leading API process ended", extra={"exitcode": leader.exitcode})
                    stopping_since = time.monotonic()
                    self._signal_all(signal.SIGTERM)
                if len(self._processes) == 1:
                    self._reap(leader)
                    code = leader.exitcode
                    return 0 if code == 0 and self._signals else (code or 1)
            if stopping_since is not None and not killed:
                overdue = time.monotonic() - stopping_since
                if overdue > self._settings.reliability.drain_timeout_s + 2 * _STOP_GRACE_S:
                    killed = True  # once: the processes may take a moment to go
                    log.error("API processes did not stop in time; killing them")
                    for process in self._processes.values():
                        process.kill()

    def _may_respawn(self) -> bool:
        now = time.monotonic()
        while self._respawns and now - self._respawns[0] > _RESPAWN_WINDOW_S:
            self._respawns.popleft()
        if len(self._respawns) >= _MAX_RESPAWNS:
            return False
        self._respawns.append(now)
        return True

    def _signal_all(self, signum: int) -> None:
        for process in self._processes.values():
            if process.pid is not None and process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def _reap(self, process: SpawnProcess) -> None:
        """An ended process's live gauges leave the sums (prometheus-client's multiprocess)."""
        process.join(1)
        if process.pid is not None:
            multiprocess.mark_process_dead(process.pid, str(self._metrics_dir))  # type: ignore[no-untyped-call]
