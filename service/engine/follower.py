"""A follower API process's side of the one engine process: it talks to it, never starts it.

With several API processes one of them (the leader) starts and supervises the engine; the others
are followers. A follower binds its results socket and connects its requests socket at addresses
the leader gave the engine, so the sockets outlive any one engine: a restarted engine connects
to the same addresses again. What the follower knows of the engine comes over those sockets:
``Ready`` (with the engine's ``incarnation``), ``Stats`` every interval (its heartbeat), and the
answers to its own requests.

- A ``Ready`` of a new incarnation means the engine was restarted: whatever was in flight to the
  old one is failed (``EngineDied``) and ``on_ready`` is called (rebuild the translator if the
  model changed).
- Silence for ``heartbeat_timeout_s`` means the engine is down or restarting: requests in flight
  fail, and ``available`` is False until the next ``Ready``.
- Every ``Submit`` names the incarnation it is meant for; a newer engine drops the ones a dead
  engine left queued in the socket.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from service.engine.protocol import (
    Cancel,
    Failed,
    Finished,
    Hello,
    Peer,
    Ready,
    Stats,
    Submit,
    api_decoder,
    encoder,
)
from service.engine.types import GenerationRequest
from service.errors import EngineDied, EngineUnavailable, ServiceError, error_of
from service.scheduling.types import Scheduled

log = logging.getLogger(__name__)


class EngineFollower:
    """The sockets of one follower API process to whichever engine is running."""

    def __init__(
        self,
        peer: Peer,
        heartbeat_timeout_s: float,
        on_ready: Callable[[Ready], Awaitable[None]],
    ) -> None:
        self._peer = peer
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._on_ready = on_ready
        self._context = zmq.asyncio.Context()
        self._sync_context = zmq.Context()
        self._requests = self._sync_context.socket(zmq.PUSH)
        self._results = self._context.socket(zmq.PULL)
        for socket in (self._requests, self._results):
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)
        self._encoder = encoder()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Scheduled]] = {}
        self._receiver: asyncio.Task[None] | None = None
        self._adopting: asyncio.Task[None] | None = None
        self.ready: Ready | None = None
        self.stats: Stats | None = None
        self.heard_at = 0.0

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def available(self) -> bool:
        """An engine has said it is ready and has been heard from recently."""
        fresh = time.monotonic() - self.heard_at <= self._heartbeat_timeout_s
        return self.ready is not None and fresh

    def start(self) -> None:
        requests_address, results_address = self._peer
        self._results.bind(results_address)
        self._requests.connect(requests_address)
        # An engine that is ready already sends its Ready again (queued until it is reached).
        self._send(Hello())
        self._receiver = asyncio.create_task(self._receive(), name="engine-follower")

    def check(self) -> None:
        """Fail what is in flight if the engine fell silent (called by the watchdog)."""
        if self.ready is not None and not self.available:
            log.error("the engine fell silent", extra={"incarnation": self.ready.incarnation})
            self.ready = None
            self.fail_all(EngineUnavailable("the engine stopped answering"))

    def submit(
        self, request: GenerationRequest, timeout_s: float | None
    ) -> tuple[int, asyncio.Future[Scheduled]]:
        ready = self.ready
        if ready is None or not self.available:
            raise EngineUnavailable("the engine is not running")
        request_id = next(self._ids)
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = Submit(
            id=request_id,
            prompt_ids=list(request.prompt_ids),
            max_new_tokens=request.max_new_tokens,
            decoding=request.decoding,
            timeout_s=timeout_s,
            incarnation=ready.incarnation,
        )
        self._send(message)
        return request_id, future

    def cancel(self, request_id: int) -> None:
        if self._pending.pop(request_id, None) is not None:
            self._send(Cancel(id=request_id))

    def fail_all(self, error: ServiceError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def stop(self) -> None:
        tasks = [task for task in (self._receiver, self._adopting) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.fail_all(EngineUnavailable("the service stopped before this finished"))
        self._requests.close(linger=0)
        self._results.close(linger=0)
        self._context.term()
        self._sync_context.term()

    def _send(self, message: Submit | Cancel | Hello) -> None:
        try:
            self._requests.send(self._encoder.encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise EngineUnavailable("the engine is not reachable") from None

    async def _receive(self) -> None:
        decoder = api_decoder()
        while True:
            message = decoder.decode(await self._results.recv())
            self.heard_at = time.monotonic()
            if isinstance(message, Finished):
                future = self._pending.pop(message.id, None)
                if future is not None and not future.done():
                    future.set_result(
                        Scheduled(message.result, message.queue_s, message.inference_s)
                    )
            elif isinstance(message, Failed):
                future = self._pending.pop(message.id, None)
                if future is not None and not future.done():
                    future.set_exception(error_of(message.code, message.message))
            elif isinstance(message, Stats):
                self.stats = message
            elif isinstance(message, Ready):
                self._new_engine(message)

    def _new_engine(self, ready: Ready) -> None:
        previous = self.ready
        if previous is not None and previous.incarnation == ready.incarnation:
            return
        self.ready = None
        self.fail_all(EngineDied("the engine was restarted"))
        log.info("engine ready", extra={"incarnation": ready.incarnation})
        # Adopted off the receive loop: building on it (a translator, preparation workers)
        # takes seconds, and the engine's reports must keep arriving meanwhile.
        if self._adopting is not None:
            self._adopting.cancel()
        self._adopting = asyncio.create_task(self._adopt(ready), name="engine-adopt")

    async def _adopt(self, ready: Ready) -> None:
        # Takes work from now on: the warm-up that ``on_ready`` may run goes through it.
        self.ready = ready
        await self._on_ready(ready)
