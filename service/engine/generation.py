"""The loaded model's identity and tokenizer side, the generation configuration (the naive
baseline's ``generate()``), and turning finished tokens into text."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from service.contract.encoding import ChatPromptEncoder
from service.contract.tokenizer import TokenizerSpec
from service.contract.types import Decoding, EngineInfo, GenerationResult
from service.engine.loading import LoadedModel, engine_info, memory_by_kind
from service.engine.tokenization import tokenizer_spec


def eos_ids(model: PreTrainedModel) -> frozenset[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def pad_token_id(tokenizer: PreTrainedTokenizerBase, eos: frozenset[int]) -> int:
    """The tokenizer's pad token, or an end-of-sequence token where it has none."""
    pad = tokenizer.pad_token_id
    return int(pad) if pad is not None else min(eos, default=0)


@lru_cache(maxsize=32)
def generation_config(
    decoding: Decoding, max_new_tokens: int, pad_id: int, eos: tuple[int, ...]
) -> GenerationConfig:
    """The transformers configuration for ``decoding`` (model card defaults live in Settings)."""
    sampling = (
        {}
        if decoding.greedy
        else {
            "temperature": decoding.temperature,
            "top_k": decoding.top_k or None,
            "top_p": decoding.top_p,
        }
    )
    return GenerationConfig(
        do_sample=not decoding.greedy,
        repetition_penalty=decoding.repetition_penalty,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=list(eos) or -1,
        **sampling,
    )


class Detokenizer:
    """Cuts generated tokens at the first EOS and decodes them, special tokens skipped."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._eos = eos

    def results(
        self, prompt_lengths: Sequence[int], generated: Sequence[Sequence[int]]
    ) -> list[GenerationResult]:
        kept: list[list[int]] = []
        stopped: list[bool] = []
        for tokens in generated:
            end = next((i for i, token in enumerate(tokens) if token in self._eos), None)
            stopped.append(end is not None)
            kept.append(list(tokens if end is None else tokens[:end]))
        texts = self._tokenizer.batch_decode(kept, skip_special_tokens=True)
        return [
            GenerationResult(
                text=text.strip(),
                prompt_tokens=prompt_length,
                # The EOS token was generated too: it counts as work done.
                completion_tokens=len(tokens) + (1 if stop else 0),
                finish_reason="stop" if stop else "length",
            )
            for prompt_length, tokens, text, stop in zip(
                prompt_lengths, kept, texts, stopped, strict=True
            )
        ]


class LoadedEngine:
    """What a loaded model exposes to the engine contract: its info, tokenizer and encoder."""

    def __init__(self, loaded: LoadedModel) -> None:
        self._device = loaded.device
        self._tokenizer = tokenizer_spec(loaded.tokenizer, loaded.add_generation_prompt)
        self._encoder = ChatPromptEncoder(self._tokenizer)
        self._eos_ids = eos_ids(loaded.model)
        self._info = engine_info(loaded)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> TokenizerSpec:
        return self._tokenizer

    @property
    def encoder(self) -> ChatPromptEncoder:
        """This model's prompt encoder, as the API process builds it from ``tokenizer``."""
        return self._encoder

    def memory_bytes(self) -> dict[str, int]:
        return memory_by_kind(self._device)
