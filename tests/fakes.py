"""A fake engine for tests where only timing, batching or faults matter.

It runs where the real one runs, in the engine process, so it is configured by a picklable
``FakeOptions`` and observed through files: every step it takes (the requests waiting when its
thread woke, at most ``capacity`` of them) is appended to ``record`` as a JSON line of prompt
lengths, and while the ``gate`` file exists steps wait. ``FakeControl`` is the test's side of
those files. The fake never imports torch, so its process starts fast.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from service.config.engine import EngineConfig, EngineLoader
from service.contract.errors import DeadlineExceeded, GenerationFailed, OutOfMemory, ServiceError
from service.contract.tokenizer import TokenizerSpec
from service.contract.types import (
    Completion,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    TextSink,
)

_BEFORE, _AFTER = 1, 2

# The fake engine reports the prompt tokens before the last in whole blocks of this as cached.
FAKE_CACHED_BLOCK = 8


def char_tokenizer() -> TokenizerSpec:
    """One token per character (printable ASCII by code, the rest unknown); the chat template
    is one token on each side."""
    vocab = {"[UNK]": 0, "<s>": _BEFORE, "</s>": _AFTER}
    vocab |= {chr(code): code for code in range(32, 127)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return TokenizerSpec(tokenizer_json=tokenizer.to_str(), before=[_BEFORE], after=[_AFTER])


@dataclass(frozen=True, slots=True)
class FakeOptions:
    delay_s: float = 0.0
    gate: Path | None = None
    record: Path | None = None
    # Requests per step (the engine's rows).
    capacity: int = 32
    # Out of memory for steps of more than this many requests, or holding a prompt of this
    # length: every request of that step fails, as the fast engine fails what it holds.
    oom_above: int | None = None
    oom_prompt_length: int | None = None
    # Every step raises (the message must never reach a client).
    error: str | None = None
    # Seconds to sleep while loading; a negative value makes the load fail.
    load_s: float = 0.0
    # Every text's answer instead of its prompt length.
    answer: str | None = None
    # How every generation ends: its turn ("stop") or its token budget ("length").
    finish_reason: FinishReason = "stop"
    # What the engine says one decode step takes, by batch size (``Engine.step_seconds``).
    step_seconds: tuple[tuple[int, float], ...] = ()
    # The share of the wall time its accelerator works: ``Engine.device_seconds`` grows at this
    # rate from the engine's start (None: not timed, as off a GPU), and the step loop's waiting
    # for it (``Engine.loop_seconds``) at the same rate, its host work at the rest.
    device_busy: float | None = None


@dataclass(slots=True)
class _Held:
    request_id: str
    request: GenerationRequest
    on_done: Completion
    on_text: TextSink | None
    loop: asyncio.AbstractEventLoop
    submitted: float
    deadline: float | None = None
    cancelled: bool = False


class FakeEngine:
    """Echoes each prompt's length (implements ``Engine``) on a thread of its own."""

    kind = "fake"

    def __init__(self, options: FakeOptions) -> None:
        self._options = options
        self._tokenizer = char_tokenizer()
        self._info = EngineInfo("fake", None, "float32", "none", "cpu", 0.0, 0)
        self._waiting: collections.deque[_Held] = collections.deque()
        self._by_id: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._running = 0
        self._steps = 0
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> TokenizerSpec:
        return self._tokenizer

    def memory_bytes(self) -> dict[str, int]:
        return {}

    def capacity(self) -> int | None:
        return self._options.capacity

    def running(self) -> int | None:
        return self._running

    def steps(self) -> int | None:
        return self._steps

    def step_seconds(self) -> dict[int, float]:
        return dict(self._options.step_seconds)

    def device_seconds(self) -> float | None:
        busy = self._options.device_busy
        return None if busy is None else busy * (time.monotonic() - self._started)

    def loop_seconds(self) -> dict[str, float]:
        busy = self._options.device_busy
        if busy is None:
            return {}
        elapsed = time.monotonic() - self._started
        return {"wait": busy * elapsed, "host": (1 - busy) * elapsed}

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
        deadline: float | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        held = _Held(request_id, request, on_done, on_text, loop, time.monotonic(), deadline)
        with self._lock:
            self._waiting.append(held)
            self._by_id[request_id] = held
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            held = self._by_id.pop(request_id, None)
            if held is not None:
                held.cancelled = True

    def _loop(self) -> None:
        while not self._stopping:
            with self._lock:
                count = min(len(self._waiting), self._options.capacity)
                step = [self._waiting.popleft() for _ in range(count)]
            step = [held for held in step if not held.cancelled and not self._expired(held)]
            if not step:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self._running = len(step)
            started = time.monotonic()
            try:
                outcomes = self._run([held.request for held in step])
            except Exception:  # as the fast engine: logged there, never shown to a client
                outcomes = [GenerationFailed("the model failed to generate")] * len(step)
            self._running = 0
            self._steps += 1
            ended = time.monotonic()
            for held, outcome in zip(step, outcomes, strict=True):
                with self._lock:
                    self._by_id.pop(held.request_id, None)
                if held.cancelled:
                    continue
                if held.on_text is not None and isinstance(outcome, GenerationResult):
                    held.loop.call_soon_threadsafe(held.on_text, outcome.text)
                held.loop.call_soon_threadsafe(
                    held.on_done, outcome, started - held.submitted, ended - started
                )

    def _expired(self, held: _Held) -> bool:
        """As the fast engine's scheduler: a request whose deadline passed while it waited is
        answered ``DeadlineExceeded`` and never reaches the model."""
        if held.deadline is None or held.deadline > time.monotonic():
            return False
        with self._lock:
            self._by_id.pop(held.request_id, None)
        passed = DeadlineExceeded("the request's deadline passed while it waited")
        held.loop.call_soon_threadsafe(held.on_done, passed, 0.0, 0.0)
        return True

    def _run(self, step: list[GenerationRequest]) -> list[GenerationResult | ServiceError]:
        options = self._options
        lengths = [len(request.prompt_ids) for request in step]
        if options.record is not None:
            with options.record.open("a") as file:
                file.write(json.dumps(lengths) + "\n")
        if options.gate is not None:
            waited = time.monotonic()
            while options.gate.exists() and time.monotonic() - waited < 30:
                time.sleep(0.005)
        if options.delay_s:
            time.sleep(options.delay_s)
        if options.error is not None:
            raise RuntimeError(options.error)
        too_many = options.oom_above is not None and len(step) > options.oom_above
        if too_many or options.oom_prompt_length in lengths:
            return [OutOfMemory("out of memory while generating")] * len(step)
        return [
            GenerationResult(
                text=options.answer if options.answer is not None else f"out:{length}",
                prompt_tokens=length,
                completion_tokens=min(3, request.max_new_tokens),
                finish_reason=options.finish_reason,
                # As if a kept prefix (the template) had given the prompt's first whole blocks.
                cached_tokens=FAKE_CACHED_BLOCK * ((length - 1) // FAKE_CACHED_BLOCK),
            )
            for length, request in zip(lengths, step, strict=True)
        ]


def load_fake(options: FakeOptions, config: EngineConfig) -> FakeEngine:
    if options.load_s < 0:
        raise RuntimeError("the fake engine was told to fail loading")
    time.sleep(options.load_s)
    return FakeEngine(options)


class FakeControl:
    """The test's side of a fake engine: its options, its gate and what it recorded."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.gate = folder / "gate"
        self.record = folder / "batches.jsonl"

    def loader(self, **options: object) -> EngineLoader:
        fake = FakeOptions(gate=self.gate, record=self.record, **options)  # type: ignore[arg-type]
        return functools.partial(load_fake, fake)

    def hold(self) -> None:
        """Steps wait from now on (until ``release``)."""
        self.gate.touch()

    def release(self) -> None:
        self.gate.unlink(missing_ok=True)

    @property
    def batches(self) -> list[list[int]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    @property
    def items_seen(self) -> int:
        return sum(len(batch) for batch in self.batches)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
