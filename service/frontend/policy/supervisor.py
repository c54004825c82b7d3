"""Engine supervision: start the engine process, watch it, restart it, or give up.

The supervisor owns the current ``EngineClient`` and the engine's state as the API sees it:

- ``loading``: the first engine is starting (readiness and liveness differ: live, not ready);
- ``warming``: the engine reported ready and the warm-up runs through it (still not ready);
- ``ready``: loaded and warm;
- ``restarting``: it died, hung (no heartbeat for ``heartbeat_timeout_s``) or stalled (holding
  work and generating nothing for ``stall_timeout_s``); a hung or stalled engine is killed
  first. Requests in flight fail at once with a 503, new ones are refused, liveness and
  readiness are 503 until the new engine is warm;
- ``failed``: the first load failed, or the engine needed more than ``max_restarts`` restarts
  within ``restart_window_s``: ``on_fatal`` is called (the CLI exits non-zero so the
  orchestrator replaces the container).

Restarting in place keeps the API process, its result cache and its open connections; exiting
is kept for what a restart evidently does not cure.

The engine is judged by what it reports, never by how late this process read it: progress is
the engine's own counters (tokens generated and model steps, not requests that ended: a wedged
engine still answers each request when its deadline passes), and time during which this
process's event loop could not read the engine's heartbeats (blocked by some handler, or
starved of CPU) does not count against the engine. A slow API process must not get a healthy
engine killed, and each kill spends the restart budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from service.config.engine import EngineConfig, EngineEntry
from service.contract.errors import EngineStalled, EngineUnavailable, NotReady, ServiceError
from service.contract.protocol import Peer, Ready, Stats
from service.frontend.engine_link.client import EngineClient, EngineLoadFailed
from service.frontend.metrics import Metrics
from service.frontend.policy.config import PolicyConfig

log = logging.getLogger(__name__)

_WATCH_PERIOD_S = 0.05
# A watchdog tick this late means the event loop was blocked: heartbeats could not be read.
_BLIND_AFTER_S = 0.25


class EngineState(enum.Enum):
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPING = "stopping"


class EngineSupervisor:
    """Keeps one engine process running and says whether it can serve."""

    def __init__(
        self,
        engine: EngineConfig,
        entry: EngineEntry,
        policy: PolicyConfig,
        metrics: Metrics,
        on_ready: Callable[[Ready], Awaitable[None]],
        on_fatal: Callable[[], None] = lambda: None,
        followers: Sequence[Peer] = (),
    ) -> None:
        self._engine = engine
        self._followers = list(followers)
        self._entry = entry
        self._policy = policy
        self._metrics = metrics
        self._on_ready = on_ready
        self._on_fatal = on_fatal
        self._settled = asyncio.Event()
        self._state = EngineState.LOADING
        self.client: EngineClient | None = None
        self.reason: str | None = None
        self._exit = asyncio.Event()
        self._restarts: deque[float] = deque()
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._progress: tuple[int, int] | None = None
        # The watchdog's awake clock (see ``_watch``), and its reading when the engine last
        # made progress and was last heard from.
        self._awake = 0.0
        self._progress_awake = 0.0
        self._heard_awake = 0.0
        self._recorded: Stats | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="engine-supervisor")
        self._watchdog = asyncio.create_task(self._watch(), name="engine-watchdog")
        for task in (self._task, self._watchdog):
            task.add_done_callback(self._crashed)

    def _crashed(self, task: asyncio.Task[None]) -> None:
        """A bug in supervision must not leave the service silently unready forever."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("engine supervision failed", exc_info=task.exception())
        if self.state is not EngineState.STOPPING:
            self._fail()

    @property
    def state(self) -> EngineState:
        return self._state

    @state.setter
    def state(self, state: EngineState) -> None:
        self._state = state
        if state in (EngineState.LOADING, EngineState.WARMING, EngineState.RESTARTING):
            self._settled.clear()
        else:
            self._settled.set()

    async def wait_settled(self) -> None:
        """Wait until the engine is ready or has failed (for tests and the CLI)."""
        await self._settled.wait()

    def working_client(self) -> EngineClient | None:
        """The engine that may take work now: ready, or warming up (for the warm-up itself)."""
        client = self.client
        if self.state in (EngineState.READY, EngineState.WARMING) and client is not None:
            return None if client.exited else client
        return None

    def availability(self) -> ServiceError | None:
        """None when the engine can take work, else the error saying why not."""
        client = self.client
        if self.state is EngineState.READY and client is not None and not client.exited:
            return None
        if self.state in (EngineState.LOADING, EngineState.WARMING):
            return NotReady("the model is loading; retry shortly")
        if self.state is EngineState.RESTARTING:
            if self.reason == "stalled":
                return EngineStalled("the engine stalled and is being restarted")
            return EngineUnavailable(f"the engine {self.reason or 'failed'} and is restarting")
        if self.state is EngineState.READY:  # exited, before the supervisor noticed
            return EngineUnavailable("the engine process exited and is restarting")
        return EngineUnavailable(f"the translation engine is {self.state.value}")

    @property
    def live(self) -> bool:
        """Liveness: loading or serving. Dead, hung, restarting or failed: not live."""
        starting = self.state in (EngineState.LOADING, EngineState.WARMING)
        return starting or self.availability() is None

    def fail_all(self, error: ServiceError) -> None:
        """Answer every request in flight to the engine with ``error`` (a drain that timed out)."""
        if self.client is not None:
            self.client.fail_all(error)

    async def stop(self) -> None:
        self.state = EngineState.STOPPING
        for task in (self._task, self._watchdog):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.client is not None:
            await self.client.stop()
        self._metrics.engine_up.set(0)

    async def _run(self) -> None:
        ever_ready = False
        while True:
            self._exit.clear()
            client = EngineClient(
                self._engine, self._entry, on_exit=self._exited, followers=self._followers
            )
            self.client = client
            started = time.monotonic()
            try:
                ready = await asyncio.wait_for(client.start(), self._policy.start_timeout_s)
                self._metrics.engine_up.set(1)
                self._record(ready)
                self.state = EngineState.WARMING
                await self._on_ready(ready)
            except asyncio.CancelledError:
                raise
            except (EngineLoadFailed, TimeoutError, ServiceError) as error:
                log.error("engine failed to start", extra={"error": str(error) or "timeout"})
                await client.stop(timeout_s=2.0)
                self._metrics.engine_up.set(0)
                self.state = EngineState.RESTARTING if ever_ready else EngineState.LOADING
                if not ever_ready or not self._may_restart():
                    self._fail()
                    return
                await asyncio.sleep(self._backoff())
                continue
            ever_ready = True
            self.state = EngineState.READY
            self.reason = None
            self._progress = None
            self._metrics.ready.set(1)
            log.info("ready", extra={"seconds": round(time.monotonic() - started, 3)})
            await self._exit.wait()
            self._metrics.ready.set(0)
            self._metrics.engine_up.set(0)
            self.state = EngineState.RESTARTING
            self.reason = self.reason or "exited"
            await client.stop(timeout_s=2.0)
            if not self._may_restart():
                self._fail()
                return
            delay = self._backoff()
            log.warning("restarting the engine", extra={"reason": self.reason, "delay_s": delay})
            self._metrics.engine_restarts.labels(reason=self.reason).inc()
            await asyncio.sleep(delay)

    def _exited(self, client: EngineClient) -> None:
        if client is self.client and self.state is not EngineState.STOPPING:
            if self.state in (EngineState.READY, EngineState.WARMING):
                self.state = EngineState.RESTARTING
                self._metrics.ready.set(0)
            self._exit.set()

    async def _watch(self) -> None:
        """Hung (no heartbeat) and stalled (busy, no progress) engines are killed.

        Both are measured on the watchdog's awake clock: the seconds this loop was free to read
        the engine's messages. A tick that comes late (the loop was blocked: a long handler, a
        full collection, a starved CPU) adds only the period it should have taken."""
        woke = time.monotonic()
        heard: tuple[EngineClient | None, float] = (None, 0.0)
        while True:
            await asyncio.sleep(_WATCH_PERIOD_S)
            now = time.monotonic()
            late = now - woke - _WATCH_PERIOD_S
            woke = now
            if late > _BLIND_AFTER_S:
                self._metrics.watchdog_blind.inc()
                log.warning(
                    "event loop blocked; that time is not held against the engine",
                    extra={"seconds": round(late, 3)},
                )
            self._awake += _WATCH_PERIOD_S + (0.0 if late > _BLIND_AFTER_S else max(0.0, late))
            client = self.client
            if client is None or client.exited or self.state is not EngineState.READY:
                continue
            if heard != (client, client.heard_at):
                heard, self._heard_awake = (client, client.heard_at), self._awake
            if self._awake - self._heard_awake > self._policy.heartbeat_timeout_s:
                self._kill(client, "hung")
                continue
            stats = client.stats
            if stats is not None:
                if stats is not self._recorded:
                    self._recorded = stats
                    self._metrics.record_engine(stats)
                if self._stalled(client, stats):
                    self._kill(client, "stalled")

    def _stalled(self, client: EngineClient, stats: Stats) -> bool:
        """Holding work while neither a token was generated nor a model step taken for the
        stall window (requests expiring at their deadline are not progress)."""
        progress = (stats.generated_tokens, stats.steps)
        if progress != self._progress or not client.in_flight:
            self._progress, self._progress_awake = progress, self._awake
            return False
        return self._awake - self._progress_awake > self._policy.stall_timeout_s

    def _kill(self, client: EngineClient, reason: str) -> None:
        log.error(f"engine {reason}; killing it", extra={"pid": client.pid})
        self.reason = reason
        self.state = EngineState.RESTARTING
        self._metrics.ready.set(0)
        client.fail_all(
            EngineStalled("the engine stalled")
            if reason == "stalled"
            else EngineUnavailable(f"the engine {reason}")
        )
        client.kill()

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > self._policy.restart_window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self._policy.max_restarts:
            return False
        self._restarts.append(now)
        return True

    def _backoff(self) -> float:
        return float(self._policy.restart_backoff_s * 2 ** max(0, len(self._restarts) - 1))

    def _fail(self) -> None:
        self.state = EngineState.FAILED
        self._metrics.ready.set(0)
        log.error("the engine cannot be started; giving up")
        with contextlib.suppress(Exception):
            self._on_fatal()

    def _record(self, ready: Ready) -> None:
        info = ready.info
        self._metrics.model_load_seconds.set(info.load_seconds)
        self._metrics.model_weights_bytes.set(info.weights_bytes)
        self._metrics.record_model(
            (info.model, info.dtype, info.quantization, info.device, ready.kind)
        )
