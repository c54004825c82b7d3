"""A fake engine for tests where only timing, batching or faults matter."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from service.engine.types import EngineInfo, GenerationRequest, GenerationResult


class CharEncoder:
    """One token per character; the chat template is a single token on each side."""

    BEFORE = (1,)
    AFTER = (2,)

    def encode_chat(self, content: str) -> tuple[int, ...]:
        return self.BEFORE + tuple(ord(c) for c in content) + self.AFTER

    def count_tokens(self, text: str) -> int:
        return len(text)


class FakeEngine:
    """Echoes each prompt's length; records every batch it receives.

    ``delay_s`` makes each batch take time; ``fail`` decides, per batch, an exception to raise.
    ``gate`` (if set) blocks each batch until it is set, to hold the worker busy in tests.
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        fail: Callable[[Sequence[GenerationRequest]], Exception | None] | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.gate = gate
        self.batches: list[list[GenerationRequest]] = []
        self._encoder = CharEncoder()
        self._info = EngineInfo("fake", None, "float32", "none", "cpu", 0.0, 0)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def encoder(self) -> CharEncoder:
        return self._encoder

    def memory_bytes(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        return None

    def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.batches.append(list(batch))
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None and (error := self.fail(batch)) is not None:
            raise error
        return [
            GenerationResult(
                text=f"out:{len(request.prompt_ids)}",
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=min(3, request.max_new_tokens),
                finish_reason="stop",
            )
            for request in batch
        ]

    @property
    def items_seen(self) -> int:
        return sum(len(batch) for batch in self.batches)
