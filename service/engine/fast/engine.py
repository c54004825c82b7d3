"""``FastEngine``: the fast engine behind the engine contract.

One thread owns the device. Each turn of its loop it takes what was submitted or cancelled from
the event loop, gives it to the scheduler (``scheduler.py``) and the output processor
(``output.py``), and runs one step (``step.py``: the scheduler plans, the model runner in
``runner.py`` executes on the device, the tokens go back to the scheduler and the output
processor). The engine itself only builds the parts and passes work across threads.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time

import torch

from service.config.engine import EngineConfig
from service.contract.errors import (
    EngineUnavailable,
    GenerationFailed,
    OutOfMemory,
    ServiceError,
)
from service.contract.types import LOOP_PARTS, Completion, GenerationRequest, TextSink
from service.engine.fast.cache import allocator_gib
from service.engine.fast.output import Client, OutputProcessor, TokenObserver
from service.engine.fast.pages import PageManager, pages_for
from service.engine.fast.prefix_cache import PREFIX_BLOCK, PrefixCache
from service.engine.fast.runner import ModelRunner
from service.engine.fast.scheduler import Scheduler
from service.engine.fast.sequence import RowParameters, Sequence
from service.engine.fast.step import Stepper, StepTimes
from service.engine.generation import LoadedEngine
from service.engine.loading import LoadedModel

log = logging.getLogger(__name__)


class FastEngine(LoadedEngine):
    """Implements ``Engine`` with the project's own paged, graph-captured decode.

    ``observe``: called on the engine thread with each finished request's token ids."""

    kind = "fast"

    def __init__(
        self, loaded: LoadedModel, config: EngineConfig, observe: TokenObserver | None = None
    ) -> None:
        super().__init__(loaded)
        self.runner = ModelRunner(loaded, config)
        plan = self.runner.plan
        self.pages = PageManager(plan.pages)
        prefixes = PrefixCache.reserve(self.pages, plan.page_size, config.fast.prefix_cache_tokens)
        self.scheduler = Scheduler(
            rows=plan.rows,
            prefill_tokens=plan.prefill_tokens,
            pages=self.pages,
            page_size=plan.page_size,
            max_positions=self.runner.weights.geometry.max_positions,
            max_new_tokens=config.max_new_tokens,
            eos=self._eos_ids,
            prefixes=prefixes,
        )
        self.output = OutputProcessor(loaded.tokenizer, self._eos_ids, observe)
        self.plan = plan
        self._inbox: collections.deque[tuple[Sequence, Client]] = collections.deque()
        self._cancels: collections.deque[str] = collections.deque()
        self._stepper = Stepper(self.scheduler, self.runner, self.output)
        self._wake = threading.Event()
        self._stopping = False
        # Model steps taken (prefill or decode): the supervisor's measure of progress.
        self._steps = 0
        label = "fp8" if self.runner.fp8 or config.model.quantization == "fp8" else None
        self._info = dataclasses.replace(
            self._info,
            quantization=label or self._info.quantization,
            weights_bytes=self.runner.weights.nbytes(),
            attention=self.runner.attention,
        )
        self._step_seconds = self.runner.time_steps()
        cache_bytes = plan.pages * self.runner.cache.page_bytes
        log.info(
            "fast engine ready",
            extra={
                **dataclasses.asdict(plan),
                # What fits: the weights, a cache of so many tokens, so many decode rows.
                "weights_gib": round(self.runner.weights.nbytes() / 2**30, 3),
                "cache_gib": round(cache_bytes / 2**30, 3),
                "cache_tokens": plan.pages * plan.page_size,
                "prefix_cache_tokens": 0 if prefixes is None else prefixes.capacity * PREFIX_BLOCK,
                "memory_budget_gib": config.fast.memory_gib,
                "step_ms": {b: round(1000 * t, 3) for b, t in self._step_seconds.items()},
                # What the allocator holds now (graphs captured, every step shape run once),
                # and the most it held so far: what a budget's workspace estimate is checked
                # against (a load's temporaries can set the peak).
                **allocator_gib(self.runner.device),
                "peak_gib": {
                    kind.removeprefix("peak_"): round(value / 2**30, 3)
                    for kind, value in self.memory_bytes().items()
                    if kind.startswith("peak_")
                },
            },
        )
        self._thread = threading.Thread(target=self._loop, name="fast-engine", daemon=True)
        self._thread.start()

    # --- the contract, called on the event loop ------------------------------------------

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
        deadline: float | None = None,
    ) -> None:
        if not self.is_alive():
            raise EngineUnavailable("the generation thread is not running")
        sequence = Sequence(
            request_id=request_id,
            prompt=tuple(request.prompt_ids),
            max_new=request.max_new_tokens,
            parameters=RowParameters.of(request.decoding),
            streams=on_text is not None,
            submitted=time.monotonic(),
            deadline=deadline,
        )
        client = Client(loop=asyncio.get_running_loop(), on_done=on_done, on_text=on_text)
        self._inbox.append((sequence, client))
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self._cancels.append(request_id)
        self._wake.set()

    def capacity(self) -> int | None:
        return self.plan.rows

    def memory_bytes(self) -> dict[str, int]:
        """The device's memory by kind, and the KV cache's pool and its committed part (read
        from the engine thread's counters without a lock: a gauge may lag a step)."""
        memory = super().memory_bytes()
        if memory:
            page = self.runner.cache.page_bytes
            memory["kv_cache"] = self.pages.usable * page
            memory["kv_cache_committed"] = self.pages.committed * page
        return memory

    def running(self) -> int | None:
        return self.scheduler.running

    def step_seconds(self) -> dict[int, float]:
        return dict(self._step_seconds)

    def step_times(self) -> StepTimes:
        """Where the step loop's time went so far (a copy; read without a lock, so it may lag
        a step)."""
        device = self.runner.clock.times
        return dataclasses.replace(
            self._stepper.times,
            device_prefill_s=device.prefill_s,
            device_decode_s=device.decode_s,
            device_decode_by_bucket=dict(device.decode_by_bucket),
            graph_prefills=self.runner.graph_prefills,
        )

    def steps(self) -> int | None:
        return self._steps

    def device_seconds(self) -> float | None:
        clock = self.runner.clock
        return clock.times.prefill_s + clock.times.decode_s if clock.on else None

    def loop_seconds(self) -> dict[str, float]:
        t = self._stepper.times  # read without a lock: a part may lag the others by a step
        parts = (
            t.prefill_launch_s,
            t.prefill_s - t.prefill_launch_s,
            t.launch_s,
            t.wait_s,
            t.host_s,
        )
        return dict(zip(LOOP_PARTS, parts, strict=True))

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)

    def teacher_forced_logits(self, ids: tuple[int, ...]) -> torch.Tensor:
        """Float32 logits ``[len(ids), vocab]`` of every position of ``ids`` through the prefill
        path, for fidelity checks; call only while the engine is idle (it uses the cache)."""
        taken = [self.pages.take() for _ in range(pages_for(len(ids), self.plan.page_size))]
        try:
            return self.runner.teacher_forced_logits(ids, taken)
        finally:
            self.pages.release(taken, 0)

    # --- the step loop, on the engine thread ----------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            self._intake()
            if not self._stepper.busy():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                with torch.inference_mode():
                    self._stepper.step()
                self._steps += 1
            except Exception as error:
                log.exception("fast engine step failed")
                self._fail_all(error)

    def _intake(self) -> None:
        while self._inbox:
            sequence, client = self._inbox.popleft()
            self.output.register(sequence.request_id, client)
            refusal = self.scheduler.add(sequence)
            if refusal is not None:
                self.output.answer(sequence, refusal)
        if self._cancels:
            cancelled = [self._cancels.popleft() for _ in range(len(self._cancels))]
            self.output.forget(self.scheduler.cancel(cancelled))

    def _fail_all(self, error: Exception) -> None:
        failure: ServiceError = (
            OutOfMemory("out of memory while generating")
            if isinstance(error, torch.OutOfMemoryError)
            else GenerationFailed("the model failed to generate")
        )
        self._stepper.fail_all(failure)
