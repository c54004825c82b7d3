"""Fidelity of the fast engine against transformers' ``generate()``: greedy tokens and logits.

For the load generator's first ``--texts`` texts, built into prompts as the service builds them:

- ``reference``: transformers' ``generate()``, greedy, one text at a time;
- ``alone``: the fast engine, each text on its own;
- ``crowd``: the fast engine, the same texts submitted at once with ``--crowd`` other requests
  (greedy too, other texts), so each runs inside a large batch;
- ``logits``: teacher-forced over prompt + reference output, transformers' forward against the
  fast engine's prefill path at every generated position: the largest and mean absolute
  difference, and the share of positions where both pick the same token;
- ``gap``: for each text whose tokens differ, how far apart transformers' own logits put the two
  tokens at the first difference (the reference's minus the engine's): a gap within the logits'
  difference is a near-tie that rounding tips, a large one a fault.

The model is loaded twice, one copy at a time (the ``dummy`` load is seeded, so both are the
same weights): transformers' reference outputs and teacher-forced logits are computed first and
kept on the host, its copy freed, then the engine loads its own with the memory budget a service
would have. Holding both at once does not fit a 30B model's cache and graphs on one GPU.

``--reference-cache PATH`` keeps transformers' side in a file, keyed by the engine config and
the counts: a run cut off after it (a device call's time limit) is taken up again without it.

    HYMT_LOAD_FORMAT=dummy HYMT_DTYPE=float32 python -m loadtests.fidelity --report f32.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loadtests.baseline import service_requests
from loadtests.loadgen import emit
from service.config.engine import EngineConfig
from service.config.settings import Settings
from service.contract.errors import ServiceError
from service.contract.types import Decoding, Engine, GenerationRequest, GenerationResult
from service.engine.fast.engine import FastEngine
from service.engine.generation import eos_ids, generation_config, pad_token_id
from service.engine.loading import LoadedModel, load_model

GREEDY = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


@dataclass
class FidelityReport:
    dtype: str
    texts: int
    crowd: int
    max_new_tokens: int
    reference_tokens: int
    identical_alone: int
    identical_crowd: int
    first_difference_alone: list[int]
    first_difference_crowd: list[int]
    gap_alone: list[float]
    gap_crowd: list[float]
    logits_positions: int
    logits_max_abs_diff: float
    logits_mean_abs_diff: float
    logits_argmax_agreement: float
    reference_s: float
    engine_s: float
    alone_s: float
    crowd_s: float
    # What the engine settled on (``Plan``: rows, pages, attention, graphs, ...).
    engine_plan: dict[str, object]


def _first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first differing token, -1 when identical."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return -1 if len(a) == len(b) else min(len(a), len(b))


def _gap(logits: torch.Tensor, wanted: list[int], got: list[int], first: int) -> float | None:
    """transformers' logit of its own token minus that of the engine's at the first difference
    (``logits``: teacher-forced over the wanted tokens); None where there is no token to
    compare (identical, or one ends first)."""
    if first < 0 or first >= min(len(wanted), len(got)):
        return None
    row = logits[first]
    return float(f"{float(row[wanted[first]] - row[got[first]]):.3g}")


class RecordingEngine(FastEngine):
    """The fast engine, keeping each finished request's generated token ids."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.tokens: dict[str, list[int]] = {}
        super().__init__(loaded, config, observe=self.tokens.__setitem__)


async def submit_all(
    engine: Engine, requests: list[GenerationRequest], prefix: str
) -> list[GenerationResult | ServiceError]:
    """Submit ``requests`` at once (ids ``{prefix}-{index}``); their outcomes, in order."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[GenerationResult | ServiceError]] = []
    for index, request in enumerate(requests):
        future: asyncio.Future[GenerationResult | ServiceError] = loop.create_future()

        def done(result: GenerationResult | ServiceError, _q: float, _r: float, f=future) -> None:  # type: ignore[no-untyped-def]
            f.set_result(result)

        engine.submit(f"{prefix}-{index}", request, done)
        futures.append(future)
    return list(await asyncio.wait_for(asyncio.gather(*futures), 600))


async def _run_fast(
    engine: RecordingEngine, requests: list[GenerationRequest], prefix: str
) -> list[list[int]]:
    for result in await submit_all(engine, requests, prefix):
        if isinstance(result, ServiceError):
            raise result
    return [engine.tokens.pop(f"{prefix}-{index}") for index in range(len(requests))]


def reference_greedy(
    loaded: LoadedModel, prompts: list[tuple[int, ...]], max_new: int
) -> list[list[int]]:
    """transformers' greedy ``generate()`` of each prompt alone: its new tokens."""
    eos = tuple(sorted(eos_ids(loaded.model)))
    pad = pad_token_id(loaded.tokenizer, frozenset(eos))
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=loaded.device)
            out = loaded.model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=generation_config(GREEDY, max_new, pad, eos),
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@dataclass
class Reference:
    """transformers' side, computed before the engine loads: the requests (the chosen texts
    first), greedy outputs of the chosen ones and, per chosen text, the float32 teacher-forced
    logits at the generated positions, on the host."""

    dtype: str
    requests: list[GenerationRequest]
    tokens: list[list[int]]
    logits: list[torch.Tensor]
    seconds: float


def dequantized_copy(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with every bitsandbytes layer replaced by a plain one holding the weights
    bitsandbytes' own functions dequantize (int8: its rows times SCB / 127): transformers'
    forward over the very numbers the fast engine multiplies, where bitsandbytes' own int8
    forward (LLM.int8()) would round the activations too."""
    import bitsandbytes.functional as bnb_functional

    for parent in list(loaded.model.modules()):
        for name, child in list(parent.named_children()):
            weight: Any = getattr(child, "weight", None)
            if hasattr(weight, "quant_state"):
                values = bnb_functional.dequantize_4bit(weight.data, weight.quant_state)
            elif hasattr(weight, "SCB"):
                values = weight.data.float() * weight.SCB.float()[:, None] * (1 / 127)
            else:
                continue
            plain = torch.nn.Linear(values.shape[1], values.shape[0], bias=False)
            plain.weight = torch.nn.Parameter(values.to(loaded.dtype), requires_grad=False)
            setattr(parent, name, plain)
    return loaded


def reference_side(
    settings: Settings,
    config: EngineConfig,
    texts: int,
    crowd: int,
    max_new: int,
    dequantized: bool = False,
) -> Reference:
    """Load transformers' model, build ``texts + crowd`` greedy requests, run the first
    ``texts`` greedy and teacher-forced, free the model. ``dequantized``: bitsandbytes layers
    replaced by their dequantized weights first (``dequantized_copy``)."""
    loaded = load_model(config)
    if dequantized:
        loaded = dequantized_copy(loaded)
    try:
        prepared = [
            dataclasses.replace(r, max_new_tokens=max_new, decoding=GREEDY)
            for r in service_requests(settings, loaded, texts + crowd, seed=0)
        ]
        requests = prepared[:texts]
        started = time.perf_counter()
        tokens = reference_greedy(loaded, [r.prompt_ids for r in requests], max_new)
        seconds = time.perf_counter() - started
        logits = []
        with torch.inference_mode():
            for request, generated in zip(requests, tokens, strict=True):
                start = len(request.prompt_ids) - 1
                forced = torch.tensor([(*request.prompt_ids, *generated)], device=loaded.device)
                forward = loaded.model(forced)
                logits.append(forward.logits[0, start:-1].float().cpu())
        dtype = str(loaded.dtype).removeprefix("torch.")
        return Reference(dtype, prepared, tokens, logits, seconds)
    finally:
        del loaded
        gc.collect()  # transformers' modules hold reference cycles: free the weights now
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _progress(phase: str, firsts: list[int], seconds: float) -> None:
    """A phase's identical count on stderr as it ends: what a run cut off later still shows."""
    identical = firsts.count(-1)
    print(
        f"{phase}: {identical} / {len(firsts)} identical in {seconds:.2f} s",
        file=sys.stderr,
        flush=True,
    )


def cached(path: Path | None, key: str, compute: Callable[[], Reference]) -> Reference:
    """``compute()``'s reference, or the one ``path`` holds for the same ``key``; saved there."""
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=False)  # the harness's own file
        if saved["key"] == key:
            print(f"reference read from {path}", file=sys.stderr, flush=True)
            return saved["reference"]  # type: ignore[no-any-return]
    reference = compute()
    print(f"reference computed in {reference.seconds:.2f} s", file=sys.stderr, flush=True)
    if path is not None:
        torch.save({"key": key, "reference": reference}, path)
    return reference


async def run(
    settings: Settings,
    texts: int,
    crowd: int,
    max_new: int,
    reference_cache: Path | None = None,
    dequantized: bool = False,
) -> FidelityReport:
    config = settings.engine_config()
    key = f"{config!r} texts={texts} crowd={crowd} max_new={max_new} dequantized={dequantized}"
    reference = cached(
        reference_cache,
        key,
        lambda: reference_side(settings, config, texts, crowd, max_new, dequantized),
    )
    chosen, others = reference.requests[:texts], reference.requests[texts:]
    expected = reference.tokens

    started = time.perf_counter()
    engine = RecordingEngine(load_model(config), config)
    engine_s = time.perf_counter() - started
    # Loading and compiling before ready can take minutes (a cold compile cache, no graphs).
    print(f"engine ready in {engine_s:.2f} s", file=sys.stderr, flush=True)
    try:
        started = time.perf_counter()
        alone = [(await _run_fast(engine, [r], f"alone{i}"))[0] for i, r in enumerate(chosen)]
        alone_s = time.perf_counter() - started
        firsts_alone = [_first_difference(a, b) for a, b in zip(expected, alone, strict=True)]
        _progress("alone", firsts_alone, alone_s)
        started = time.perf_counter()
        mixed = await _run_fast(engine, [*chosen, *others], "crowd")
        crowd_s = time.perf_counter() - started
        firsts_crowd = [_first_difference(a, b) for a, b in zip(expected, mixed, strict=False)]
        _progress("crowd", firsts_crowd, crowd_s)
        max_diff, sum_diff, positions, agree = 0.0, 0.0, 0, 0
        gap_alone: list[float] = []
        gap_crowd: list[float] = []
        with torch.inference_mode():
            for index, (request, tokens) in enumerate(zip(chosen, expected, strict=True)):
                forced = (*request.prompt_ids, *tokens)
                start = len(request.prompt_ids) - 1
                theirs = reference.logits[index]
                ours = engine.teacher_forced_logits(forced)[start:-1].cpu()
                diff = (theirs - ours).abs()
                max_diff = max(max_diff, float(diff.max()))
                sum_diff += float(diff.mean()) * diff.shape[0]
                positions += diff.shape[0]
                agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
                for firsts, got, gaps in (
                    (firsts_alone, alone, gap_alone),
                    (firsts_crowd, mixed, gap_crowd),
                ):
                    gap = _gap(theirs, tokens, got[index], firsts[index])
                    if gap is not None:
                        gaps.append(gap)
    finally:
        engine.close()
    return FidelityReport(
        dtype=reference.dtype,
        texts=texts,
        crowd=crowd,
        max_new_tokens=max_new,
        reference_tokens=sum(len(t) for t in expected),
        identical_alone=firsts_alone.count(-1),
        identical_crowd=firsts_crowd.count(-1),
        first_difference_alone=[i for i in firsts_alone if i >= 0],
        first_difference_crowd=[i for i in firsts_crowd if i >= 0],
        gap_alone=gap_alone,
        gap_crowd=gap_crowd,
        logits_positions=positions,
        logits_max_abs_diff=max_diff,
        logits_mean_abs_diff=sum_diff / max(positions, 1),
        logits_argmax_agreement=round(agree / max(positions, 1), 6),
        reference_s=round(reference.seconds, 2),
        engine_s=round(engine_s, 2),
        alone_s=round(alone_s, 2),
        crowd_s=round(crowd_s, 2),
        engine_plan=dataclasses.asdict(engine.plan),
    )


def main(argv: list[str] | None = None) -> FidelityReport:
    parser = argparse.ArgumentParser(prog="python -m loadtests.fidelity", description=__doc__)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--crowd", type=int, default=1000)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--reference-cache", type=Path, help="keep transformers' side here")
    parser.add_argument(
        "--dequantized-reference",
        action="store_true",
        help="bitsandbytes weights: compare with transformers over their dequantized numbers "
        "(what the engine multiplies) instead of bitsandbytes' own forward",
    )
    args = parser.parse_args(argv)
    settings = Settings(engine="fast")
    report = asyncio.run(
        run(
            settings,
            args.texts,
            args.crowd,
            args.max_new_tokens,
            args.reference_cache,
            args.dequantized_reference,
        )
    )
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
