"""The API process's side of one engine process: start it, talk to it, notice when it is gone.

``EngineClient`` spawns the engine process (multiprocessing spawn: a fresh interpreter, no
inherited CUDA or thread state), sets up the two ZeroMQ ``ipc://`` sockets between them, and
answers each ``submit`` with a future resolved by the engine's ``Finished`` or ``Failed``. It
keeps the engine's last ``Stats`` and when it was heard from. The process's exit is watched on
its sentinel from the event loop, so a SIGKILL is known at once: every future in flight fails
with ``EngineDied`` and ``on_exit`` is called. One client is one engine incarnation; a restarted
engine gets a new client with fresh sockets.

Nothing here imports torch: the engine process is the only place it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

from service.config.engine import EngineConfig, EngineEntry
from service.contract.errors import EngineDied, EngineUnavailable, ServiceError
from service.contract.protocol import (
    Cancel,
    LoadFailed,
    Peer,
    Ready,
    Shutdown,
    Stats,
)
from service.contract.types import GenerationRequest, Scheduled, TextSink
from service.frontend.engine_link.channel import EngineChannel

log = logging.getLogger(__name__)


class EngineLoadFailed(Exception):
    """The engine process could not load its model (the message says why)."""


class EngineClient:
    """One engine process and the sockets to it."""

    def __init__(
        self,
        config: EngineConfig,
        entry: EngineEntry,
        on_exit: Callable[[EngineClient], None] | None = None,
        followers: Sequence[Peer] = (),
    ) -> None:
        """``followers``: the sockets of further API processes the engine serves as well (each
        binds its own results socket; the engine binds their requests sockets)."""
        self._config = config
        self._followers = list(followers)
        self._entry = entry
        self._on_exit = on_exit
        self._folder = tempfile.mkdtemp(prefix="hymt-engine-")
        self._channel = EngineChannel()
        self._ready: asyncio.Future[Ready] | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._receiver: asyncio.Task[None] | None = None
        self.stats: Stats | None = None
        self.heard_at = time.monotonic()
        self.exited = False
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._channel.in_flight

    async def start(self) -> Ready:
        """Spawn the engine and wait until it is loaded; ``EngineLoadFailed`` if it cannot."""
        loop = asyncio.get_running_loop()
        requests_address = f"ipc://{self._folder}/requests"
        results_address = f"ipc://{self._folder}/results"
        self._channel.open(requests_address, results_address)
        self._ready = loop.create_future()
        self._receiver = asyncio.create_task(self._receive(), name="engine-results")
        context = multiprocessing.get_context("spawn")
        process = context.Process(
            target=self._entry,
            args=(self._config, [(requests_address, results_address), *self._followers]),
            name="hymt-engine",
            daemon=True,
        )
        # Spawning pickles the config and starts an interpreter: off the event loop.
        await asyncio.to_thread(process.start)
        self._process = process
        self.heard_at = time.monotonic()
        loop.add_reader(process.sentinel, self._exited)
        log.info("engine process started", extra={"pid": process.pid})
        return await asyncio.shield(self._ready)

    def submit(
        self, request: GenerationRequest, deadline: float | None, on_text: TextSink | None = None
    ) -> tuple[int, asyncio.Future[Scheduled]]:
        """Send ``request``; the future resolves with its answer or the error of its failure.
        ``on_text`` gets each piece of text the engine streams before its answer."""
        if self.exited:
            raise EngineDied("the engine process is not running")
        return self._channel.submit(request, deadline, on_text=on_text)

    def cancel(self, request_id: int) -> None:
        """Tell the engine to drop ``request_id`` (its caller is gone); no answer will come."""
        if self._channel.forget(request_id) and not self.exited:
            self._channel.send(Cancel(id=request_id))

    def fail_all(self, error: ServiceError) -> None:
        """Answer every request in flight with ``error`` (shutdown, death)."""
        self._channel.fail_all(error)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the engine to stop, then make sure it has: kill it if it has not gone (it
        ignores SIGTERM, which a signal to the whole process group would bring it)."""
        if self._stopping:
            return
        self._stopping = True
        process = self._process
        if process is not None and process.is_alive():
            self._channel.send(Shutdown())
            await asyncio.to_thread(process.join, timeout_s)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 2.0)
            log.info(
                "engine process stopped", extra={"pid": process.pid, "exitcode": process.exitcode}
            )
        # Nothing sent from now on can be answered: no caller may wait forever.
        self.fail_all(EngineUnavailable("the engine stopped before this finished"))
        self._close()

    def kill(self) -> None:
        """SIGKILL the engine (a hung engine cannot be asked); its exit is handled as a death."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    async def _receive(self) -> None:
        while True:
            message = await self._channel.receive()
            self.heard_at = time.monotonic()
            if isinstance(message, Stats):
                self.stats = message
            elif isinstance(message, Ready | LoadFailed) and self._waiting_for_ready():
                assert self._ready is not None
                if isinstance(message, Ready):
                    self._ready.set_result(message)
                else:
                    self._ready.set_exception(EngineLoadFailed(message.message))

    def _waiting_for_ready(self) -> bool:
        return self._ready is not None and not self._ready.done()

    def _exited(self) -> None:
        process = self._process
        assert process is not None
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join(0.5)  # it has ended (its sentinel fired): this only reaps it
        self.exited = True
        code = process.exitcode
        if not self._stopping:  # a stop logs the exit code once the process is reaped
            log.error("engine process exited", extra={"pid": process.pid, "exitcode": code})
        self.fail_all(EngineDied(f"the engine process exited (code {code})"))
        if self._waiting_for_ready():
            assert self._ready is not None
            self._ready.set_exception(
                EngineLoadFailed(f"the engine process exited while loading (code {code})")
            )
        if self._on_exit is not None:
            self._on_exit(self)

    def _close(self) -> None:
        if self._process is not None and not self.exited:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._process.sentinel)
            self.exited = True
        if self._receiver is not None:
            self._receiver.cancel()
        self._channel.close()
        shutil.rmtree(self._folder, ignore_errors=True)
