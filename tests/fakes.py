"""A fake engine for tests where only timing, batching or faults matter.

It runs where the real one runs, in the engine process, so it is configured by a picklable
``FakeOptions`` and observed through files: every batch it receives is appended to ``record``
as a JSON line of prompt lengths, and while the ``gate`` file exists batches wait. ``FakeControl``
is the test's side of those files. The fake never imports torch, so its process starts fast.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from service.engine.config import EngineConfig
from service.engine.protocol import TokenizerSpec
from service.engine.types import EngineInfo, EngineLoader, GenerationRequest, GenerationResult
from service.errors import OutOfMemory

_BEFORE, _AFTER = 1, 2


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
    # Out of memory for batches of more than this many texts, or holding a prompt of this length.
    oom_above: int | None = None
    oom_prompt_length: int | None = None
    # Every batch raises (the message must never reach a client).
    error: str | None = None
    # Seconds to sleep while loading; a negative value makes the load fail.
    load_s: float = 0.0
    # Every text's answer instead of its prompt length.
    answer: str | None = None


class FakeEngine:
    """Echoes each prompt's length (implements the static ``Engine``)."""

    def __init__(self, options: FakeOptions) -> None:
        self._options = options
        self._tokenizer = char_tokenizer()
        self._info = EngineInfo("fake", None, "float32", "none", "cpu", 0.0, 0)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> TokenizerSpec:
        return self._tokenizer

    def memory_bytes(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        return None

    def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        options = self._options
        lengths = [len(request.prompt_ids) for request in batch]
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
        too_many = options.oom_above is not None and len(batch) > options.oom_above
        if too_many or options.oom_prompt_length in lengths:
            raise OutOfMemory(f"out of memory generating a batch of {len(batch)}")
        return [
            GenerationResult(
                text=options.answer if options.answer is not None else f"out:{length}",
                prompt_tokens=length,
                completion_tokens=min(3, request.max_new_tokens),
                finish_reason="stop",
            )
            for length, request in zip(lengths, batch, strict=True)
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
        """Batches wait from now on (until ``release``)."""
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
