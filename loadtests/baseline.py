"""The article's approach, measured on the same texts: one ``model.generate()`` per request.

The model is loaded once (the article's fix for reloading per request) with the service's own
loading code and settings, and each text becomes exactly the request the service would build
(same template, chat encoding and token budget, through ``PromptBuilder``). Generation is forced
to that budget (``min_new_tokens``) so both sides do the same work even where the service's
model would stop at EOS; the service's random-weight models run to the budget anyway. The
model is plain transformers, as in the article: the service's compiled norms stay off.

    python -m loadtests.baseline --requests 16 --report baseline.json   # HYMT_* as for the service
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from loadtests.loadgen import emit
from loadtests.texts import make_jobs
from service.config.settings import Settings
from service.contract.encoding import ChatPromptEncoder
from service.contract.types import GenerationRequest
from service.engine.generation import eos_ids, generation_config, pad_token_id
from service.engine.loading import LoadedModel, load_model
from service.engine.tokenization import tokenizer_spec
from service.frontend import layers
from service.frontend.translation.prompt_builder import PromptBuilder


@dataclass
class BaselineReport:
    requests: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    ms_per_output_token: float
    load_s: float


def service_requests(
    settings: Settings, loaded: LoadedModel, count: int, seed: int
) -> list[GenerationRequest]:
    """The engine requests the service builds for the load generator's first ``count`` texts."""
    encoder = ChatPromptEncoder(tokenizer_spec(loaded.tokenizer))
    prompts = PromptBuilder(layers.translation_config(settings), encoder, "baseline")
    prepared = []
    for job in make_jobs(count, seed=seed):
        target, source = prompts.languages_of(job.target_lang, None)
        prepared.append(prompts.prepare(job.texts[0], target, source, field="text").request)
    return prepared


class NaiveGenerator:
    """One ``model.generate()`` per request, forced to the request's budget."""

    def __init__(self, loaded: LoadedModel) -> None:
        self._loaded = loaded
        eos = eos_ids(loaded.model)
        self._eos = tuple(sorted(eos))
        self._pad = pad_token_id(loaded.tokenizer, eos)

    def __call__(self, request: GenerationRequest) -> int:
        """The tokens generated for ``request``."""
        config = copy.copy(
            generation_config(request.decoding, request.max_new_tokens, self._pad, self._eos)
        )
        config.min_new_tokens = request.max_new_tokens
        ids = torch.tensor([request.prompt_ids], device=self._loaded.device)
        with torch.inference_mode():
            out = self._loaded.model.generate(  # type: ignore[operator]
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
            )
        return int(out.shape[1] - ids.shape[1])

    def timed(self, requests: list[GenerationRequest]) -> tuple[int, float]:
        """Output tokens of ``requests`` generated one after another, and the seconds it took."""
        cuda = self._loaded.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        tokens = sum(self(request) for request in requests)
        if cuda:
            torch.cuda.synchronize()
        return tokens, time.perf_counter() - started


def run(settings: Settings, requests: int, seed: int) -> BaselineReport:
    loaded = load_model(settings.engine_config())
    prepared = service_requests(settings, loaded, requests + 1, seed)
    naive = NaiveGenerator(loaded)
    naive(prepared[0])  # warm-up, as the article does
    tokens, duration = naive.timed(prepared[1:])
    return BaselineReport(
        requests=requests,
        output_tokens=tokens,
        duration_s=round(duration, 3),
        output_tokens_per_s=round(tokens / duration, 2),
        ms_per_output_token=round(1000 * duration / tokens, 2),
        load_s=round(loaded.load_seconds, 2),
    )


def main(argv: list[str] | None = None) -> BaselineReport:
    parser = argparse.ArgumentParser(prog="python -m loadtests.baseline", description=__doc__)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    report = run(Settings(), args.requests, args.seed)
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
