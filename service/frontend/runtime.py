"""The service's lifecycle in the API process: engine process, admission, translator, drain.

``Runtime`` is created by ``create_app`` and driven by its lifespan. Starting spawns the engine
process under the supervisor and returns at once, so liveness answers while the model loads;
readiness turns green only after the engine reported ready and the translator's warm-up went
through it. On each (re)start the translator is built from what the engine reported (its
tokenizer and model fingerprint) or kept from the previous incarnation.

``drain`` is what SIGTERM runs before the HTTP server stops: admission closes (new requests get
a JSON 503 with Retry-After), texts in flight get up to ``drain_timeout_s`` to finish, and
whatever is left is answered 503 at once. ``stop`` then stops the engine process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from service.collector import tune_collector
from service.config.engine import EngineConfig, EngineEntry
from service.contract.encoding import ChatPromptEncoder
from service.contract.errors import EngineUnavailable, ServiceError
from service.contract.protocol import Peer, Ready
from service.contract.types import EngineInfo, GenerationResult
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission
from service.frontend.policy.config import PolicyConfig
from service.frontend.policy.dispatch import Dispatcher
from service.frontend.policy.following import FollowingSupervisor, Supervision
from service.frontend.policy.supervisor import EngineState, EngineSupervisor
from service.frontend.shared import Redis, SharedCache
from service.frontend.stalls import StallMonitor
from service.frontend.translation.cache import ResultCache, SecondLevel
from service.frontend.translation.core import TranslationCore
from service.frontend.translation.languages import LanguageTable
from service.frontend.translation.preparation import Preparer
from service.frontend.translation.prompt_builder import PromptBuilder
from service.frontend.translation.results import TranslationConfig
from service.frontend.translation.translator import Translator

log = logging.getLogger(__name__)


class Runtime:
    """The engine supervisor, admission and translator of one app."""

    def __init__(
        self,
        engine: EngineConfig,
        policy: PolicyConfig,
        translation: TranslationConfig,
        metrics: Metrics,
        entry: EngineEntry,
        *,
        workers: int = 2,
        on_fatal: Callable[[], None] = lambda: None,
        tune_gc: bool = False,
        follow: Peer | None = None,
        followers: Sequence[Peer] = (),
        before_engine_stop: Callable[[], Awaitable[None]] | None = None,
        redis: Redis | None = None,
    ) -> None:
        """``redis``: the replicas' shared state (a cache behind this process's own);
        ``followers``: the sockets of follower API processes the engine serves as well;
        ``follow``: this API process is one of them, reaching the leader's engine over these
        sockets (``service.frontend.policy.following``)."""
        self.policy = policy
        self.metrics = metrics
        self.started_at = time.monotonic()
        self.ready_after_s: float | None = None
        self.engine_info: EngineInfo | None = None
        self.engine_kind: str | None = None
        self._translation = translation
        self._workers = workers
        self._before_engine_stop = before_engine_stop
        self._stopping = asyncio.Event()  # set when the drain begins
        # Only where this process is the service (not, say, a test process hosting many apps).
        self._tune_collector = tune_gc
        # Started with the runtime (while the engine loads); configured once the engine says
        # which tokenizer it runs.
        self._preparer: Preparer | None = None
        self._preparer_started: asyncio.Task[None] | None = None
        self._translator: Translator | None = None
        self.redis = redis
        shared: SecondLevel[GenerationResult] | None = (
            SharedCache(redis, dataclasses.asdict, _result_of, "result")
            if redis is not None and translation.cache_size > 0
            else None
        )
        self._cache: ResultCache[GenerationResult] = ResultCache(
            translation.cache_size, translation.cache_ttl_s, second=shared
        )
        self.supervisor: Supervision
        if follow is None:
            self.supervisor = EngineSupervisor(
                engine,
                entry,
                policy,
                metrics,
                on_ready=self._on_ready,
                on_fatal=on_fatal,
                followers=followers,
            )
        else:  # a follower API process: the leader runs the engine
            self.supervisor = FollowingSupervisor(follow, policy, metrics, self._on_ready)
        self.admission = Admission(
            policy.max_in_flight,
            metrics,
            self.supervisor.availability,
            processes=policy.processes,
            most_tokens=policy.max_new_tokens,
        )
        self._dispatcher = Dispatcher(self.supervisor, self.admission, metrics)
        self._languages = LanguageTable()
        self._stalls = StallMonitor(metrics)

    @property
    def state(self) -> EngineState:
        return self.supervisor.state

    @property
    def translator(self) -> Translator:
        """The translator, or the error that says why the service cannot translate now."""
        failure = self.failure()
        if failure is not None:
            raise failure
        assert self._translator is not None
        return self._translator

    def failure(self) -> ServiceError | None:
        """Why the service is not serving, or None when it is."""
        if self.admission.closed:
            return EngineUnavailable("the service is shutting down; retry on another replica")
        unavailable = self.supervisor.availability()
        if unavailable is not None:
            return unavailable
        if self._translator is None:
            return EngineUnavailable("the translator is not built yet")
        return None

    @property
    def preparer(self) -> Preparer | None:
        """The text-preparation workers, once the engine has reported its tokenizer."""
        preparer = self._preparer
        return preparer if preparer is not None and preparer.fingerprint is not None else None

    @property
    def max_text_chars(self) -> int:
        return self._translation.max_text_chars

    @property
    def cache_ttl_s(self) -> float:
        return self._translation.cache_ttl_s

    @property
    def live(self) -> bool:
        return self.supervisor.live

    @property
    def in_flight(self) -> int:
        return self.admission.in_flight

    def start(self) -> None:
        self._stalls.start()
        self.supervisor.start()
        # The workers' interpreters, imports and detector load while the engine loads.
        self._preparer = Preparer(self._translation, self._workers)
        self._preparer_started = asyncio.get_running_loop().create_task(
            self._preparer.start(), name="preparation-start"
        )

    async def wait_started(self) -> None:
        """Wait until the engine is ready or has failed (for tests and the CLI)."""
        await self.supervisor.wait_settled()

    async def unless_stopping(self, waited: Awaitable[None]) -> None:
        """Await ``waited`` until it ends or this process starts to drain, whichever is first
        (what is left of ``waited`` is cancelled)."""
        job = asyncio.ensure_future(waited)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait((job, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            job.cancel()
            stopping.cancel()
        if job in done:
            job.result()  # its exception, if it raised one

    async def _on_ready(self, ready: Ready) -> None:
        """A (re)started engine reported ready: build or keep the translator, warm up."""
        self.engine_info, self.engine_kind = ready.info, ready.kind
        self.admission.set_engine(ready.capacity, ready.step_seconds)
        fingerprint = ready.info.fingerprint
        preparer, started = self._preparer, self._preparer_started
        assert preparer is not None, "the runtime was not started"
        assert started is not None
        await started
        if preparer.fingerprint != fingerprint:
            await preparer.configure(ready.tokenizer, fingerprint)
        # On the event loop only for what is cheap (languages, lengths); texts are prepared by
        # the preparer's worker processes.
        # Building the tokenizer from its serialized form is CPU work: off the probes' loop.
        encoder = await asyncio.to_thread(ChatPromptEncoder, ready.tokenizer)
        prompts = PromptBuilder(
            self._translation,
            encoder,
            fingerprint,
            languages=self._languages,
        )
        translator = Translator(
            TranslationCore(
                self._translation,
                prompts=prompts,
                generator=self._dispatcher,
                admission=self.admission,
                cache=self._cache,
                metrics=self.metrics,
                preparer=preparer,
            )
        )
        if self._translation.warmup:
            warm_started = time.monotonic()
            await translator.warm_up()
            log.info("warm-up done", extra={"seconds": round(time.monotonic() - warm_started, 3)})
        self._translator = translator
        if self.ready_after_s is None:
            self.ready_after_s = time.monotonic() - self.started_at
        if self._tune_collector:
            tune_collector()

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; let texts in flight finish for ``timeout_s``; answer the rest 503."""
        if self.admission.closed:
            return
        self.admission.close()
        self._stopping.set()
        self.metrics.ready.set(0)
        log.info("draining", extra={"in_flight": self.in_flight, "timeout_s": timeout_s})
        drained = await self.admission.wait_idle(timeout_s)
        # Texts still being prepared must not reach the engine after the drain either.
        self.supervisor.state = EngineState.STOPPING
        if not drained:
            log.warning("drain timed out", extra={"in_flight": self.in_flight})
            self.supervisor.fail_all(
                EngineUnavailable("the service shut down before this finished")
            )

    async def stop(self, drain_timeout_s: float) -> None:
        """Drain (if SIGTERM did not already), then stop the engine process."""
        # An engine that could not be (re)started takes no more work from anyone: nothing to
        # wait for before stopping it (a leader would wait out its followers' grace).
        gave_up = self.supervisor.state is EngineState.FAILED
        await self.drain(drain_timeout_s)
        if self._before_engine_stop is not None and not gave_up:
            await self._before_engine_stop()
        await self.supervisor.stop()
        if self._preparer is not None and self._preparer_started is not None:
            # Let a start still under way finish (seconds), so no worker outlives the close.
            with contextlib.suppress(Exception):
                await self._preparer_started
            self._preparer.close()
        await self._stalls.stop()
        if self.redis is not None:
            await self.redis.close()


def _result_of(value: object) -> GenerationResult:
    """A ``GenerationResult`` back from the shared cache's JSON."""
    assert isinstance(value, dict)
    return GenerationResult(**value)
