"""The service's lifecycle: load the engine, start the scheduler, warm up, serve, drain.

``Runtime`` is created by ``create_app`` and driven by its lifespan. Loading runs in a background
task so the HTTP server answers at once: liveness is green while the model loads and readiness
turns green only after warm-up. A load failure leaves the runtime ``failed``: readiness and
liveness both turn red, so an orchestrator restarts the process.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

from service.config import Settings
from service.engine.continuous import ContinuousBatchingEngine
from service.engine.loading import load_model
from service.engine.static import StaticBatchEngine
from service.engine.types import ContinuousEngine, Decoding, Engine, EngineInfo
from service.engine.worker import EngineWorker
from service.errors import EngineStalled, EngineUnavailable, NotReady, ServiceError
from service.metrics import Metrics
from service.scheduling.continuous import ContinuousScheduler
from service.scheduling.microbatch import BatchingLimits, MicroBatchScheduler
from service.scheduling.types import GenerationScheduler
from service.translation.cache import ResultCache
from service.translation.detection import LanguageDetector
from service.translation.languages import LanguageTable
from service.translation.translator import PromptBuilder, Translator

log = logging.getLogger(__name__)

AnyEngine = Engine | ContinuousEngine
EngineLoader = Callable[[Settings], AnyEngine]


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


def load_transformers_engine(settings: Settings) -> AnyEngine:
    """The production loader: transformers model and tokenizer as the settings say."""
    loaded = load_model(settings)
    kind = settings.engine
    if kind == "auto":
        kind = "continuous" if loaded.device.type == "cuda" else "static"
    if kind == "continuous":
        return ContinuousBatchingEngine(loaded, settings, Decoding.from_settings(settings))
    return StaticBatchEngine(loaded)


class Runtime:
    """Holds the engine worker, scheduler and translator of one app."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        loader: EngineLoader = load_transformers_engine,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.state = State.LOADING
        self.started_at = time.monotonic()
        self.ready_after_s: float | None = None
        self.engine_info: EngineInfo | None = None
        self._loader = loader
        self._translator: Translator | None = None
        self._scheduler: GenerationScheduler | None = None
        self._engine: AnyEngine | None = None
        self._worker: EngineWorker | None = None
        self._startup: asyncio.Task[None] | None = None

    @property
    def translator(self) -> Translator:
        """The translator, or the error that says why there is none yet."""
        if self.state is State.READY and self._translator is not None and not self.stalled:
            return self._translator
        raise self.failure()

    @property
    def stalled(self) -> bool:
        return self._scheduler is not None and self._scheduler.stalled

    def failure(self) -> ServiceError:
        """The error that explains why the runtime is not serving."""
        if self.stalled:
            return EngineStalled("the model worker is stalled")
        if self.state is State.LOADING:
            return NotReady("the model is loading; retry shortly")
        return EngineUnavailable(f"the translation engine is {self.state.value}")

    @property
    def queue_depth(self) -> int:
        return self._scheduler.depth if self._scheduler else 0

    def start(self) -> None:
        self._startup = asyncio.create_task(self._start(), name="runtime-startup")

    async def wait_started(self) -> None:
        """Wait until loading ended, ready or failed (for tests and the CLI)."""
        if self._startup is not None:
            await asyncio.shield(self._startup)

    async def _start(self) -> None:
        try:
            self._worker = EngineWorker(lambda: self._loader(self.settings))
            self._engine = engine = await self._worker.start()
            self.engine_info = info = engine.info
            self._record_model(engine)
            self._scheduler = self._make_scheduler(engine, self._worker)
            self._scheduler.start()
            languages = LanguageTable()
            detector = await asyncio.to_thread(LanguageDetector, languages)
            translator = Translator(
                self.settings,
                prompts=PromptBuilder(
                    self.settings,
                    engine.encoder,
                    info.fingerprint,
                    languages=languages,
                    detector=detector,
                ),
                scheduler=self._scheduler,
                cache=ResultCache(self.settings.cache_size, self.settings.cache_ttl_s),
                metrics=self.metrics,
            )
            if self.settings.warmup:
                warm_started = time.monotonic()
                await translator.warm_up()
                log.info(
                    "warm-up done", extra={"seconds": round(time.monotonic() - warm_started, 3)}
                )
            self._translator = translator
            self.state = State.READY
            self.ready_after_s = time.monotonic() - self.started_at
            self.metrics.ready.set(1)
            log.info("ready", extra={"seconds_since_start": round(self.ready_after_s, 3)})
        except asyncio.CancelledError:
            raise
        except Exception:
            self.state = State.FAILED
            log.exception("engine failed to start")

    def _make_scheduler(self, engine: AnyEngine, worker: EngineWorker) -> GenerationScheduler:
        if isinstance(engine, ContinuousEngine):
            return ContinuousScheduler(engine, self.settings.max_queue_size, self.metrics)
        return MicroBatchScheduler(
            worker,
            BatchingLimits(
                max_batch_size=self.settings.max_batch_size,
                max_batch_tokens=self.settings.max_batch_tokens,
                max_wait_s=self.settings.max_wait_ms / 1000,
                max_queue_size=self.settings.max_queue_size,
                stall_timeout_s=self.settings.stall_timeout_s,
            ),
            self.metrics,
        )

    def _record_model(self, engine: AnyEngine) -> None:
        info = engine.info
        self.metrics.model_load_seconds.set(info.load_seconds)
        self.metrics.model_weights_bytes.set(info.weights_bytes)
        self.metrics.model.info(
            {
                "model": info.model,
                "dtype": info.dtype,
                "quantization": info.quantization,
                "device": info.device,
            }
        )
        self.metrics.watch_gpu_memory(engine.memory_bytes)

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop serving: drain the queue for up to ``drain_timeout_s``, then release the worker."""
        self.state = State.STOPPING
        self.metrics.ready.set(0)
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
            await asyncio.gather(self._startup, return_exceptions=True)
        if self._scheduler is not None:
            await self._scheduler.close(drain_timeout_s)
        if self._worker is not None:
            await self._worker.close()
