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
import itertools
import logging
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from service.engine.config import EngineConfig
from service.engine.protocol import (
    Cancel,
    Failed,
    Finished,
    Peer,
    Ready,
    Shutdown,
    Stats,
    Submit,
    api_decoder,
    encoder,
)
from service.engine.types import GenerationRequest
from service.errors import EngineDied, EngineUnavailable, ServiceError, error_of
from service.scheduling.types import Scheduled

log = logging.getLogger(__name__)


class EngineLoadFailed(Exception):
    """The engine process could not load its model (the message says why)."""


class EngineClient:
    """One engine process and the sockets to it."""

    def __init__(
        self,
        config: EngineConfig,
        loader: Callable[[EngineConfig], object],
        on_exit: Callable[[EngineClient], None] | None = None,
        followers: Sequence[Peer] = (),
    ) -> None:
        """``followers``: the sockets of further API processes the engine serves as well (each
        binds its own results socket; the engine binds their requests sockets)."""
        self._config = config
        self._followers = list(followers)
        self._loader = loader
        self._on_exit = on_exit
        self._folder = tempfile.mkdtemp(prefix="hymt-engine-")
        # Requests are sent synchronously (never blocking: no high-water mark, admission bounds
        # what is in flight); answers are awaited on the event loop.
        self._sync_context = zmq.Context()
        self._context = zmq.asyncio.Context()
        self._requests = self._sync_context.socket(zmq.PUSH)
        self._results = self._context.socket(zmq.PULL)
        for socket in (self._requests, self._results):
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)
        self._encoder = encoder()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Scheduled]] = {}
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
        return len(self._pending)

    async def start(self) -> Ready:
        """Spawn the engine and wait until it is loaded; ``EngineLoadFailed`` if it cannot."""
        from service.engine.process import run_engine

        loop = asyncio.get_running_loop()
        requests_address = f"ipc://{self._folder}/requests"
        results_address = f"ipc://{self._folder}/results"
        # The engine binds the requests socket and this side connects: a connecting PUSH
        # queues from the start, where a bound one refuses to send until the engine's
        # connection is registered, which can be after its ``Ready`` arrived on the other socket.
        self._requests.connect(requests_address)
        self._results.bind(results_address)
        self._ready = loop.create_future()
        self._receiver = asyncio.create_task(self._receive(), name="engine-results")
        context = multiprocessing.get_context("spawn")
        process = context.Process(
            target=run_engine,
            args=(
                self._config,
                self._loader,
                [(requests_address, results_address), *self._followers],
            ),
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
        self, request: GenerationRequest, timeout_s: float | None
    ) -> tuple[int, asyncio.Future[Scheduled]]:
        """Send ``request``; the future resolves with its answer or the error of its failure."""
        if self.exited:
            raise EngineDied("the engine process is not running")
        request_id = next(self._ids)
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = Submit(
            id=request_id,
            prompt_ids=list(request.prompt_ids),
            max_new_tokens=request.max_new_tokens,
            decoding=request.decoding,
            timeout_s=timeout_s,
        )
        self._send(message)
        return request_id, future

    def cancel(self, request_id: int) -> None:
        """Tell the engine to drop ``request_id`` (its caller is gone); no answer will come."""
        future = self._pending.pop(request_id, None)
        if future is not None and not self.exited:
            self._send(Cancel(id=request_id))

    def fail_all(self, error: ServiceError) -> None:
        """Answer every request in flight with ``error`` (shutdown, death)."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the engine to stop, then make sure it has: terminate, then kill (once)."""
        if self._stopping:
            return
        self._stopping = True
        process = self._process
        if process is not None and process.is_alive():
            self._send(Shutdown())
            await asyncio.to_thread(process.join, timeout_s)
            if process.is_alive():
                process.terminate()
                await asyncio.to_thread(process.join, 2.0)
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

    def _send(self, message: Submit | Cancel | Shutdown) -> None:
        try:
            self._requests.send(self._encoder.encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise EngineUnavailable("the engine's request queue is full") from None

    async def _receive(self) -> None:
        decoder = api_decoder()
        while True:
            message = decoder.decode(await self._results.recv())
            self.heard_at = time.monotonic()
            if isinstance(message, Finished):
                self._answer(message)
            elif isinstance(message, Failed):
                future = self._pending.pop(message.id, None)
                if future is not None and not future.done():
                    future.set_exception(error_of(message.code, message.message))
            elif isinstance(message, Stats):
                self.stats = message
            elif self._ready is not None and not self._ready.done():
                if isinstance(message, Ready):
                    self._ready.set_result(message)
                else:
                    self._ready.set_exception(EngineLoadFailed(message.message))

    def _answer(self, message: Finished) -> None:
        future = self._pending.pop(message.id, None)
        if future is None or future.done():
            return
        future.set_result(Scheduled(message.result, message.queue_s, message.inference_s))

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
        if self._ready is not None and not self._ready.done():
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
        self._requests.close(linger=0)
        self._results.close(linger=0)
        self._context.term()
        self._sync_context.term()
        shutil.rmtree(self._folder, ignore_errors=True)
