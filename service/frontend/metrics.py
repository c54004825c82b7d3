"""Every Prometheus metric of the service, declared once.

``Metrics`` owns its own ``CollectorRegistry`` (never the global one), so two apps in one process,
as in tests, do not collide. It lives in the API process; the engine process reports its
figures in ``Stats`` messages, recorded here by ``record_engine``. Layers receive the instance and
record at their boundaries: HTTP middleware (requests), translator (cache), admission (in flight,
refusals), dispatcher (queue wait, generation time, tokens, failures), supervisor (engine up,
restarts, load), stall monitor (event-loop lag, collector pauses). Labels stay low-cardinality:
route templates, status codes, reasons.

With several API processes (``HYMT_API_PROCESSES``) every process records into files of
prometheus-client's multiprocess mode (``shared_dir``), and ``render`` adds up all of them, so
``/metrics`` of any process shows the whole service. Each gauge says how its processes' values
combine (``multiprocess_mode``): counts held per process are summed over the live ones; what
only the leader records (the engine's reports, the model) is the live maximum; ``ready`` is the
live minimum (1 only while every process serves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE,
)
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from service.contract.protocol import Stats

PREFIX = "hymt"

# Latency buckets span a cache hit (sub-millisecond) to a long CPU generation (minutes).
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Stalls of the API process's event loop: from unnoticeable to over a probe's timeout.
_STALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

__all__ = ["PROMETHEUS_CONTENT_TYPE", "Children", "Metrics"]

_M = TypeVar("_M", bound=MetricWrapperBase)


class Children(Generic[_M]):
    """A labelled metric's children, each looked up once: ``labels()`` validates its arguments
    and takes a lock on every call, which on a refusal's path cost more than the rest of its
    metrics. Label values must stay bounded (route templates, status codes, reasons)."""

    def __init__(self, metric: _M) -> None:
        self._metric: _M = metric
        self._children: dict[tuple[str, ...], _M] = {}

    def __call__(self, *values: str) -> _M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    """The service's metrics on a private registry."""

    def __init__(self, shared_dir: Path | None = None) -> None:
        """``shared_dir``: the multiprocess-mode directory of a group of API processes (the
        environment's ``PROMETHEUS_MULTIPROC_DIR``, set before prometheus-client was imported)."""
        self._shared_dir = shared_dir
        self.registry = CollectorRegistry(auto_describe=True)
        # Called before each rendering: counts kept aside while they were made (the door's
        # refusals) go into the metrics first.
        self.before_render: list[Callable[[], None]] = []
        self._model_labels: tuple[str, ...] | None = None
        # The engine's running totals at its last report, and its steps then (fewer steps in
        # a report: a new engine, whose totals start again from zero).
        self._engine_totals: dict[str, float] = {}
        self._engine_steps = 0
        self._declare_http(self.registry)
        self._declare_translations(self.registry)
        self._declare_queue(self.registry)
        self._declare_engine(self.registry)
        self._declare_engine_work(self.registry)
        self._declare_process(self.registry)

    def _declare_http(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            f"{PREFIX}_requests_total",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "HTTP request latency by route template, from first byte in to response start.",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _declare_translations(self, r: CollectorRegistry) -> None:
        self.target_mismatches = Counter(
            f"{PREFIX}_target_language_mismatches_total",
            "Translations whose detected language is surely not their target language "
            "(answered anyway, flagged target_language_mismatch).",
            ["target"],
            registry=r,
        )
        self.cache_hits = Counter(
            f"{PREFIX}_cache_hits_total", "Translations answered from the result cache.", registry=r
        )
        self.cache_misses = Counter(
            f"{PREFIX}_cache_misses_total",
            "Translations not found in the result cache (generated or shared in flight).",
            registry=r,
        )
        self.cache_shared = Counter(
            f"{PREFIX}_cache_shared_total",
            "Cache misses that joined an identical generation already in flight.",
            registry=r,
        )
        self.cache_entries = Gauge(
            f"{PREFIX}_cache_entries",
            "Translations held by the result cache.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.shared_cache_hits = Counter(
            f"{PREFIX}_shared_cache_hits_total",
            "Translations found in the shared (Redis) cache after a miss in this process's own.",
            registry=r,
        )

    def _declare_queue(self, r: CollectorRegistry) -> None:
        self.in_flight = Gauge(
            f"{PREFIX}_in_flight_texts",
            "Texts admitted and not yet answered (being prepared, waiting or generating).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth",
            "Texts inside the engine waiting to start generating (engine's last report).",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.engine_running = Gauge(
            f"{PREFIX}_engine_running_texts",
            "Texts generating right now (engine's last report).",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Per text: from being sent to the engine until its generation started.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_rejections = Counter(
            f"{PREFIX}_queue_rejections_total",
            "Texts refused or dropped before they were answered, by reason: queue_full, "
            "deadline_unreachable (refused at admission), deadline (passed while waiting), "
            "cancelled (the client left).",
            ["reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "Texts generating together, sampled at each engine report while it generates.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            f"{PREFIX}_inference_duration_seconds",
            "Per text: from the start of its generation to its answer (prefill, decode, "
            "detokenization).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generation_failures = Counter(
            f"{PREFIX}_generation_failures_total",
            "Texts whose generation failed in the engine, by error code.",
            ["code"],
            registry=r,
        )

    def _declare_engine(self, r: CollectorRegistry) -> None:
        self.engine_up = Gauge(
            f"{PREFIX}_engine_up",
            "1 while an engine process is running and loaded, 0 while it is down or loading.",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.engine_restarts = Counter(
            f"{PREFIX}_engine_restarts_total",
            "Engine process restarts, by reason (exited, hung, stalled).",
            ["reason"],
            registry=r,
        )
        self.watchdog_blind = Counter(
            f"{PREFIX}_engine_watchdog_blind_total",
            "Times the engine watchdog found the API process's event loop blocked (the engine's "
            "heartbeats could not be read meanwhile, so that time is not held against it).",
            registry=r,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens_total", "Prompt tokens processed by the model.", registry=r
        )
        self.cached_prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens_cached_total",
            "Prompt tokens whose keys and values the engine copied from a kept prefix (the "
            "template, a repeated glossary, context or text) instead of computing them; also "
            "counted in hymt_prompt_tokens_total.",
            registry=r,
        )
        self.generated_tokens = Counter(
            f"{PREFIX}_generated_tokens_total", "Tokens generated by the model.", registry=r
        )
        self.generations_cut = Counter(
            f"{PREFIX}_generations_cut_total",
            "Generations that stopped at their token budget (HYMT_MAX_NEW_TOKENS, or the "
            "text's share of it from HYMT_OUTPUT_TOKENS_RATIO) instead of ending their turn: "
            "answers cut short. A model with random weights seldom ends its turn, so nearly "
            "all of its generations count.",
            registry=r,
        )
        self.model_load_seconds = Gauge(
            f"{PREFIX}_model_load_seconds",
            "Seconds the model took to load (weights and tokenizer, before warm-up).",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.model_weights_bytes = Gauge(
            f"{PREFIX}_model_weights_bytes",
            "Bytes of the loaded model's weights.",
            multiprocess_mode="livemax",
            registry=r,
        )
        # A gauge of 1 rather than an Info (which multiprocess mode lacks); same exposition.
        self.model = Gauge(
            f"{PREFIX}_model_info",
            "The loaded model, dtype, quantization, device and engine (value 1).",
            ["model", "dtype", "quantization", "device", "engine"],
            multiprocess_mode="livemax",
            registry=r,
        )

    def _declare_engine_work(self, r: CollectorRegistry) -> None:
        """Where the engine's time and the accelerator's memory go."""
        self.device_busy = Gauge(
            f"{PREFIX}_engine_device_busy_ratio",
            "Share of the engine's last report interval that the accelerator spent inside its "
            "prefills and decode steps (CUDA events around each; a wait inside one for the "
            "host's launches counts as busy; work read after its interval is counted in the "
            "next; absent off a GPU): under load, below 1 the device waited for the host "
            "between them.",
            ["device"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.loop_seconds = Counter(
            f"{PREFIX}_engine_loop_seconds_total",
            "Seconds the engine's step loop spent, by part: prefill_launch (launching a "
            "prefill's kernels or graph), prefill_other (its planning, the wait for its first "
            "tokens, their join), decode_launch, wait (the host idle while the device works on "
            "the step before), host (the host's work on the tokens: rows, finished requests, "
            "text, answers). Absent where the engine does not time its loop.",
            ["part"],
            registry=r,
        )
        self.device_seconds = Counter(
            f"{PREFIX}_engine_device_seconds_total",
            "Seconds the accelerator spent inside the engine's prefills and decode steps (CUDA "
            "events around each; 0 off a GPU, where nothing is timed): its rate is the "
            "device's busy share over any window, where hymt_engine_device_busy_ratio is the "
            "last report's.",
            registry=r,
        )
        self.gpu_memory = Gauge(
            f"{PREFIX}_gpu_memory_bytes",
            "Accelerator memory held by the model process, by kind (allocated, reserved, their "
            "peaks since start: peak_allocated, peak_reserved; the fast engine's kv_cache and "
            "kv_cache_committed).",
            ["kind"],
            multiprocess_mode="livemax",
            registry=r,
        )

    def _declare_process(self, r: CollectorRegistry) -> None:
        self.redis_up = Gauge(
            f"{PREFIX}_redis_up",
            "1 while the shared state (HYMT_REDIS_URL) answers, 0 while the service uses local "
            "limits and cache instead; absent without Redis.",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.ready = Gauge(
            f"{PREFIX}_ready",
            "1 when the model is loaded, warm and serving.",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.event_loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How much later than asked the API process's event loop ran a timer set every "
            "50 ms: the time it was busy with something else.",
            buckets=_STALL_BUCKETS,
            registry=r,
        )
        self.gc_pause = Histogram(
            f"{PREFIX}_gc_pause_seconds",
            "Garbage-collector passes in the API process by generation, and how long each "
            "stopped it.",
            ["generation"],
            buckets=_STALL_BUCKETS,
            registry=r,
        )

    def record_engine(self, stats: Stats) -> None:
        """The engine process's latest report."""
        self.queue_depth.set(max(0, stats.in_flight - stats.running))
        self.engine_running.set(stats.running)
        if stats.running:
            self.batch_size.observe(stats.running)
        for kind, value in stats.memory.items():
            self.gpu_memory.labels(kind=kind).set(value)
        if stats.device_busy is not None:
            device = self._model_labels[3] if self._model_labels else "unknown"
            self.device_busy.labels(device=device).set(stats.device_busy)
        if stats.steps < self._engine_steps:
            self._engine_totals = {}
        self._engine_steps = stats.steps
        for part, seconds in stats.loop_seconds.items():
            self._advance(part, seconds, self.loop_seconds.labels(part=part))
        if stats.device_seconds is not None:
            self._advance("device", stats.device_seconds, self.device_seconds)

    def _advance(self, total: str, value: float, counter: Counter) -> None:
        """Adds what the engine's running ``total`` gained since its last report (nothing when
        it reads lower: the engine reads its parts without a lock, and one may lag a step)."""
        gained = value - self._engine_totals.get(total, 0.0)
        if gained > 0:
            counter.inc(gained)
            self._engine_totals[total] = value

    def record_model(self, labels: tuple[str, str, str, str, str]) -> None:
        """The loaded model's description (model, dtype, quantization, device, engine)."""
        if self._model_labels is not None and self._model_labels != labels:
            # Set to 0, not removed: a multiprocess file keeps every value it was ever given.
            self.model.labels(*self._model_labels).set(0)
        self._model_labels = labels
        self.model.labels(*labels).set(1)

    def render(self) -> bytes:
        """The exposition text of every metric (of every API process, with several)."""
        for settle in self.before_render:
            settle()
        if self._shared_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self._shared_dir))  # type: ignore[no-untyped-call]
        return generate_latest(registry)
