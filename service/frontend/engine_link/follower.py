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
import logging
import time
from collections.abc import Awaitable, Callable

from service.contract.errors import EngineDied, EngineUnavailable, ServiceError
from service.contract.protocol import Cancel, Hello, Peer, Ready, Stats
from service.contract.types import GenerationRequest, Scheduled, TextSink
from service.frontend.engine_link.channel import EngineChannel

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
        self._channel = EngineChannel()
        self._receiver: asyncio.Task[None] | None = None
        self._adopting: asyncio.Task[None] | None = None
        self.ready: Ready | None = None
        self.stats: Stats | None = None
        self.heard_at = 0.0

    @property
    def in_flight(self) -> int:
        return self._channel.in_flight

    @property
    def available(self) -> bool:
        """An engine has said it is ready and has been heard from recently."""
        fresh = time.monotonic() - self.heard_at <= self._heartbeat_timeout_s
        return self.ready is not None and fresh

    def start(self) -> None:
        self._channel.open(*self._peer)
        # An engine that is ready already sends its Ready again (queued until it is reached).
        self._channel.send(Hello())
        self._receiver = asyncio.create_task(self._receive(), name="engine-follower")

    def check(self) -> None:
        """Fail what is in flight if the engine fell silent (called by the watchdog)."""
        if self.ready is not None and not self.available:
            log.error("the engine fell silent", extra={"incarnation": self.ready.incarnation})
            self.ready = None
            self.fail_all(EngineUnavailable("the engine stopped answering"))

    def submit(
        self, request: GenerationRequest, deadline: float | None, on_text: TextSink | None = None
    ) -> tuple[int, asyncio.Future[Scheduled]]:
        ready = self.ready
        if ready is None or not self.available:
            raise EngineUnavailable("the engine is not running")
        return self._channel.submit(request, deadline, ready.incarnation, on_text)

    def cancel(self, request_id: int) -> None:
        if self._channel.forget(request_id):
            self._channel.send(Cancel(id=request_id))

    def fail_all(self, error: ServiceError) -> None:
        self._channel.fail_all(error)

    async def stop(self) -> None:
        tasks = [task for task in (self._receiver, self._adopting) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.fail_all(EngineUnavailable("the service stopped before this finished"))
        self._channel.close()

    async def _receive(self) -> None:
        while True:
            message = await self._channel.receive()
            self.heard_at = time.monotonic()
            if isinstance(message, Stats):
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
