"""Engine supervision in a follower API process: follow the engine the leader runs.

A follower never starts, kills or restarts the engine; the leader's ``EngineSupervisor`` does.
It only says, from what reaches its own sockets (``EngineFollower``), whether the engine can
serve: ``loading`` until the first ``Ready`` has been adopted (the translator built on it),
``warming`` while one is being adopted, ``ready``, and ``restarting`` once the engine fell
silent or was replaced, until the next ``Ready``. It offers the same face to the runtime and
the dispatcher as the leader's supervisor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from service.contract.errors import EngineUnavailable, NotReady, ServiceError
from service.contract.protocol import Peer, Ready
from service.frontend.engine_link.follower import EngineFollower
from service.frontend.metrics import Metrics
from service.frontend.policy.config import PolicyConfig
from service.frontend.policy.supervisor import EngineState, EngineSupervisor

log = logging.getLogger(__name__)


_WATCH_PERIOD_S = 0.05


class FollowingSupervisor:
    """Says whether the leader's engine can serve this follower, and hands out its sockets."""

    def __init__(
        self,
        peer: Peer,
        policy: PolicyConfig,
        metrics: Metrics,
        on_ready: Callable[[Ready], Awaitable[None]],
    ) -> None:
        self._metrics = metrics
        self._on_ready = on_ready
        self.client = EngineFollower(peer, policy.heartbeat_timeout_s, on_ready=self._adopt)
        self.state = EngineState.LOADING
        self._settled = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.client.start()
        self._watchdog = asyncio.create_task(self._watch(), name="engine-following")

    async def stop(self) -> None:
        self.state = EngineState.STOPPING
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        await self.client.stop()
        self._metrics.engine_up.set(0)

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def working_client(self) -> EngineFollower | None:
        serving = self.state in (EngineState.READY, EngineState.WARMING)
        return self.client if serving and self.client.available else None

    def availability(self) -> ServiceError | None:
        if self.state is EngineState.READY and self.client.available:
            return None
        if self.state in (EngineState.LOADING, EngineState.WARMING):
            return NotReady("the model is loading; retry shortly")
        if self.state is EngineState.STOPPING:
            return EngineUnavailable("the service is stopping")
        return EngineUnavailable("the engine is restarting")

    @property
    def live(self) -> bool:
        # A follower's liveness is the engine's: the leader restarts it, or exits if it cannot.
        starting = self.state in (EngineState.LOADING, EngineState.WARMING)
        return starting or self.availability() is None

    def fail_all(self, error: ServiceError) -> None:
        self.client.fail_all(error)

    async def _adopt(self, ready: Ready) -> None:
        first = self.state is EngineState.LOADING
        self.state = EngineState.WARMING
        try:
            await self._on_ready(ready)
        except Exception:
            log.exception("could not adopt the engine")
            self.state = EngineState.LOADING if first else EngineState.RESTARTING
            raise
        self.state = EngineState.READY
        self._metrics.engine_up.set(1)
        self._metrics.ready.set(1)
        self._settled.set()

    async def _watch(self) -> None:
        # The engine's reports are not recorded here but by the leader: recorded by every
        # process, a histogram such as the batch size would count each report once per process.
        while True:
            await asyncio.sleep(_WATCH_PERIOD_S)
            if self.state is not EngineState.READY:
                continue
            self.client.check()
            if not self.client.available:
                log.error("the engine is gone; waiting for the leader's next one")
                self.state = EngineState.RESTARTING
                self._metrics.engine_up.set(0)
                self._metrics.ready.set(0)


# What the runtime and the dispatcher supervise through, in a leader or a follower.
Supervision = EngineSupervisor | FollowingSupervisor
