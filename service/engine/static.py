"""The static micro-batch engine: one left-padded ``model.generate()`` per batch.

Prompts are left-padded with an attention mask so every row's last prompt token sits at the same
position and generation starts together; transformers derives position ids from the mask, so a
padded row computes what it would alone. Each row stops at its own token budget through a
stopping criterion; rows that finished wait (as pads) for the batch to end.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from service.engine.generation import LoadedEngine, generation_config
from service.engine.loading import LoadedModel
from service.engine.types import (
    GenerationRequest,
    GenerationResult,
)
from service.errors import GenerationFailed, OutOfMemory

log = logging.getLogger(__name__)


class _RowBudgets(StoppingCriteria):
    """Marks row i finished once it generated ``budgets[i]`` tokens."""

    def __init__(self, prompt_width: int, budgets: Sequence[int], device: torch.device) -> None:
        self._width = prompt_width
        self._budgets = torch.tensor(budgets, device=device)

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
    ) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._width
        return self._budgets <= generated  # type: ignore[return-value]


class StaticBatchEngine(LoadedEngine):
    """Implements ``Engine`` with transformers' ``generate`` on padded batches."""

    def __init__(self, loaded: LoadedModel) -> None:
        self._loaded = loaded
        super().__init__(loaded)
        self._model = loaded.model

    def close(self) -> None:
        return None

    def generate(self, batch: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if not batch:
            return []
        decoding = batch[0].decoding
        if any(request.decoding != decoding for request in batch):
            raise ValueError("a batch must share one decoding configuration")
        width = max(len(request.prompt_ids) for request in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            start = width - len(request.prompt_ids)
            input_ids[row, start:] = torch.tensor(request.prompt_ids, dtype=torch.long)
            attention_mask[row, start:] = 1
        budgets = [request.max_new_tokens for request in batch]
        try:
            with torch.inference_mode():
                output = self._model.generate(  # type: ignore[operator]
                    input_ids=input_ids.to(self._device),
                    attention_mask=attention_mask.to(self._device),
                    generation_config=generation_config(
                        decoding, max(budgets), self._pad_id, tuple(sorted(self._eos_ids))
                    ),
                    stopping_criteria=StoppingCriteriaList(
                        [_RowBudgets(width, budgets, self._device)]
                    ),
                )
        except torch.OutOfMemoryError as error:
            raise OutOfMemory(f"out of memory generating a batch of {len(batch)}") from error
        except RuntimeError as error:
            log.exception("generation failed", extra={"batch_size": len(batch)})
            raise GenerationFailed("the model failed to generate") from error
        generated = [
            row[:budget] for row, budget in zip(output[:, width:].tolist(), budgets, strict=True)
        ]
        return self._detokenizer.results([len(r.prompt_ids) for r in batch], generated)
