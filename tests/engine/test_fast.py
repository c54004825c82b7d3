"""The fast engine on the demo model, on a CPU, in float32: what runs without a GPU.

Greedy output must equal transformers' ``generate()`` token for token, for each text alone and
inside a crowd larger than the decode batch (so requests wait, join and leave while others run),
with prompts longer than one prefill chunk, with each decode attention, and compiled by inductor
for the CPU. CUDA graphs, FlexAttention's fused kernel and the flash prefill kernel run on the GPU
only (docs/benchmarks.md has those figures).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from torch._dynamo.utils import counters
from transformers import RepetitionPenaltyLogitsProcessor

from loadtests.fidelity import RecordingEngine, reference_greedy, submit_all
from service.config.engine import EngineConfig, EngineSettings
from service.config.model import ModelSettings
from service.config.settings import Settings
from service.contract.errors import ServiceError
from service.contract.types import (
    MODEL_CARD_DECODING,
    Decoding,
    GenerationRequest,
    GenerationResult,
)
from service.engine.demo import ensure_demo_model
from service.engine.fast import gemv, rope, sampler
from service.engine.fast import runner as runner_module
from service.engine.fast.cache import KV_FP8, page_bytes
from service.engine.fast.checkpoint import Fp8Checkpoint
from service.engine.fast.engine import FastEngine
from service.engine.fast.linear import fp8_linear, linear, quantize_fp8
from service.engine.fast.plan import fold_norms_for
from service.engine.fast.prefix_cache import PREFIX_BLOCK
from service.engine.fast.sampler import (
    FULL_SORT_ROWS,
    RowSampling,
    first_argmax,
    full_sort_rows,
    race_noise,
    sample,
    sample_rows,
)
from service.engine.fast.weights import is_dense, take_weights
from service.engine.generation import eos_ids
from service.engine.loading import LoadedModel, load_model
from tests.conftest import ServiceClient, StartApp

GREEDY = Decoding(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
MAX_NEW = 12
TEXTS = [
    "hello there",
    "a somewhat longer sentence to translate into a few more words than the others",
    "今天天气很好，我们去公园散步吧。",
    "x y z",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two",
    "مرحبا بالعالم",
]


def _config(data_dir: Path, chat_format: str = "hunyuan-7b", **fast: object) -> EngineConfig:
    # An explicit cache budget (page count) and a decode batch smaller than the crowd.
    values: dict[str, object] = {
        "page_size": 16,
        "num_pages": 160,
        "max_rows": 4,
        "prefill_tokens": 24,
    }
    values.update(fast)
    shipped = {"hunyuan-7b": "hunyuan-mt-7b", "hy-v3": "hy-mt2-30b-a3b"}[chat_format]
    return EngineConfig(
        model=ModelSettings(data_dir=data_dir, device="cpu", dtype="float32"),
        chat_format=chat_format,  # type: ignore[arg-type]
        shipped_config=shipped,
        max_new_tokens=MAX_NEW,
        fast=EngineSettings.model_validate(values),
    )


def _with(config: EngineConfig, **model: object) -> EngineConfig:
    """``config`` with these model settings."""
    return dataclasses.replace(config, model=config.model.model_copy(update=model))


@pytest.fixture(scope="module")
def reference(data_dir: Path) -> LoadedModel:
    return load_model(_config(data_dir))


@pytest.fixture(scope="module")
def prompts(reference: LoadedModel) -> list[tuple[int, ...]]:
    return [tuple(reference.tokenizer.encode(text)) for text in TEXTS]


@pytest.fixture(scope="module")
def expected(reference: LoadedModel, prompts: list[tuple[int, ...]]) -> list[list[int]]:
    """transformers' greedy tokens for each prompt, generated alone."""
    return reference_greedy(reference, prompts, MAX_NEW)


@pytest.fixture(params=["gather", "flex", "triton"])
def engine(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[RecordingEngine]:
    # The Triton kernel runs in Triton's interpreter here, slowly: lone rows only (a crowd's
    # larger batches take FlexAttention, as they do above the kernel's batch sizes on a GPU).
    small: dict[str, object] = {"triton_attention_rows": 1} if request.param == "triton" else {}
    config = _config(data_dir, "hunyuan-7b", attention=request.param, **small)
    built = RecordingEngine(load_model(config), config)
    assert built.info.attention.startswith(f"paged-{request.param}")
    # The bound as set (off a GPU nothing is measured); no other attention has one.
    assert built.plan.triton_rows == (1 if request.param == "triton" else 0)
    yield built
    built.close()


def _strip_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """The tokens up to and with the first EOS (what both engines generate)."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


def _wanted(model: LoadedModel, expected: list[list[int]]) -> list[list[int]]:
    """``generate()``'s tokens cut after the first EOS, as the engine stops there."""
    eos = eos_ids(model.model)
    return [_strip_eos(tokens, eos) for tokens in expected]


async def _generated(
    engine: RecordingEngine, requests: list[GenerationRequest], prefix: str
) -> list[list[int]]:
    """Submit ``requests`` at once; each one's tokens (every one must succeed)."""
    results = await submit_all(engine, requests, prefix=prefix)
    assert all(isinstance(r, GenerationResult) for r in results)
    return [engine.tokens[f"{prefix}-{index}"] for index in range(len(requests))]


async def _alone(engine: RecordingEngine, requests: list[GenerationRequest]) -> list[list[int]]:
    """Each request's tokens, submitted one at a time."""
    return [(await _generated(engine, [r], f"alone{i}"))[0] for i, r in enumerate(requests)]


async def test_greedy_equals_generate_alone_and_in_a_crowd(
    engine: RecordingEngine,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
) -> None:
    wanted = _wanted(reference, expected)
    requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
    # The 5th prompt is longer than a prefill chunk (24 tokens): it is prefilled in pieces.
    assert max(len(p) for p in prompts) > 24
    # Alone, each takes the engine's attention; Triton's (in its slow interpreter here) for
    # three of them: a short one, one in another script and the one prefilled in chunks.
    alone = [0, 2, 4] if engine.plan.triton_rows else range(len(prompts))
    assert await _alone(engine, [requests[i] for i in alone]) == [wanted[i] for i in alone]
    # A crowd of 4x the texts, in 4 decode rows: they queue, join and leave mid-flight. From
    # their second sighting the prompts' blocks are kept, then copied in instead of prefilled.
    assert await _generated(engine, requests * 4, "crowd") == wanted * 4
    assert engine.scheduler.prefixes is not None
    assert engine.scheduler.prefixes.reused_tokens > 0
    # Every page went back once everything finished.
    assert engine.pages.committed == 0


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl-launches"])
async def test_one_row_kernels_with_passed_norm_sums_equal_generate(
    pdl: bool, data_dir: Path, prompts: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone request's decode as a GPU runs it with folded norms: every projection of the step
    # on the one-row kernel (here in Triton's interpreter, in float32), each norm's sum of
    # squares added up by the projection that wrote its row and no norm kernel between them.
    # With the fused RoPE too, the layers launch only the engine's kernels, and "pdl" launches
    # them as HYMT_FAST_PDL does (the interpreter takes the launch option; the kernels' wait
    # instructions are CUDA's, left out here).
    pytest.importorskip("triton")
    monkeypatch.setattr(gemv, "runs", lambda dtype, device: True)
    # Wide blocks: few programs, each a vectorised step for the interpreter (the GPU's block
    # sizes are swept there; they do not change the arithmetic).
    monkeypatch.setattr(gemv, "DEFAULT", gemv.GemvConfig(256, 256, 4, 2))
    # (The decode attention's own PDL launch is in test_decode_kernel.py: the gathered one
    # here, which the interpreter runs quickly.)
    rope = "on" if pdl else "off"
    config = _config(data_dir, attention="gather", fold_norms="on", max_rows=1, fused_rope=rope)
    reference = _uneven_norms(load_model(config))
    wanted = _wanted(reference, reference_greedy(reference, prompts[:3], MAX_NEW))
    engine = RecordingEngine(_uneven_norms(load_model(config)), config)
    try:
        sums = engine.runner.model._sums
        assert sums is not None
        assert not engine.plan.one_row_pdl  # a CPU has no CUDA graphs to launch them in
        engine.runner.model._one_row_pdl = pdl
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts[:3]]
        assert await _alone(engine, requests) == wanted
        # At rest every layer's sums are cleared for the next step (the first layer's input sum
        # is written, not added to, and the spare after the last is never read).
        assert all(not bool(layer_sums.any()) for layer_sums in sums[1:-1])
    finally:
        engine.close()


def test_fused_rope_on_refuses_to_start_without_triton(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rope, "_kernel", None)  # what a CPU build of torch, without Triton, has
    config = _config(data_dir, attention="gather", fused_rope="on")
    with pytest.raises(RuntimeError, match="fast_fused_rope=on needs Triton"):
        FastEngine(load_model(config), config)


def test_pdl_on_refuses_to_start_where_the_step_cannot_take_it(data_dir: Path) -> None:
    config = _config(data_dir, attention="gather", fold_norms="on", fused_rope="on", pdl="on")
    with pytest.raises(RuntimeError, match="fast_pdl=on needs"):
        FastEngine(load_model(config), config)


def test_norms_fold_by_default_only_where_a_lone_requests_layers_launch_with_pdl(
    data_dir: Path, reference: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # auto folds a dense model's norms where PDL then runs the lone request's layers (the
    # folded step measured faster only there); never a mixture of experts' unless asked to.
    monkeypatch.setattr(gemv, "runs", lambda dtype, device: True)  # a GPU's 16-bit weights
    moe = load_model(_config(data_dir, "hy-v3"))
    assert not is_dense(moe.model)
    assert is_dense(reference.model)
    assert fold_norms_for("auto", reference, False, None, one_row_pdl=True)
    assert not fold_norms_for("auto", reference, False, None, one_row_pdl=False)
    assert not fold_norms_for("auto", moe, True, None, one_row_pdl=True)
    assert fold_norms_for("on", moe, True, None, one_row_pdl=False)
    assert not fold_norms_for("off", reference, False, None, one_row_pdl=True)
    monkeypatch.setattr(gemv, "runs", lambda dtype, device: False)  # float32, or a CPU
    assert not fold_norms_for("auto", reference, False, None, one_row_pdl=True)


async def test_fused_rope_equals_generate(
    data_dir: Path,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
) -> None:
    # The decode layers' RoPE, query/key norms and cache writes as one Triton kernel (rope.py;
    # a GPU's bf16 path), in Triton's interpreter: slow here, so one decode row, texts alone,
    # three of them: a short one, one in another script and one prefilled in chunks.
    config = _config(data_dir, attention="gather", fused_rope="on", max_rows=1)
    engine = RecordingEngine(load_model(config), config)
    try:
        assert engine.plan.fused_rope
        chosen = [0, 2, 4]
        assert len(prompts[4]) > 24  # longer than a prefill chunk
        requests = [GenerationRequest(prompts[i], MAX_NEW, GREEDY) for i in chosen]
        wanted = _wanted(reference, expected)
        assert await _alone(engine, requests) == [wanted[i] for i in chosen]
    finally:
        engine.close()


@pytest.mark.parametrize("shapes", ["dynamic", "static"])
async def test_compiled_step_equals_generate(
    shapes: str,
    data_dir: Path,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a GPU runs, less the graphs and FlexAttention's kernel: the step's inputs, each layer
    # and the logits-and-sampling tail compiled by inductor (for this CPU), in two decode rows:
    # with the batch size symbolic after the first bucket, or compiled for each bucket.
    config = _config(data_dir, attention="gather", compile="on", max_rows=2, decode_shapes=shapes)
    with caplog.at_level(logging.INFO, logger="service.engine.fast.runner"):
        engine = RecordingEngine(load_model(config), config)
    compiled = counters["stats"]["unique_graphs"]
    warmed = [r for r in caplog.records if r.getMessage() == "decode compiled"]
    assert [r.buckets for r in warmed] == [2]  # type: ignore[attr-defined]
    try:
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _generated(engine, requests * 2, "crowd") == _wanted(reference, expected) * 2
        if shapes == "static":
            # Every bucket compiled before ready, in the mode the step loop runs in: serving
            # compiles nothing (where it did, a GPU's many buckets passed dynamo's recompile
            # limit and every request failed), sampled requests and the full sort (no top-k)
            # included. Dynamic shapes compile once more, for the pages.
            full = dataclasses.replace(MODEL_CARD_DECODING, top_k=0)
            sampled = [GenerationRequest(p, MAX_NEW, MODEL_CARD_DECODING) for p in prompts]
            sampled.append(GenerationRequest(prompts[0], MAX_NEW, full))
            await _generated(engine, sampled, "sampled")
            assert counters["stats"]["unique_graphs"] == compiled
    finally:
        engine.close()


def _uneven_norms(loaded: LoadedModel) -> LoadedModel:
    """The demo model with norm weights that are not all ones (as a trained model's are not),
    the same on every load."""
    generator = torch.Generator().manual_seed(7)
    for layer in loaded.model.model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.data = torch.rand(norm.weight.shape, generator=generator) + 0.5
    return loaded


async def test_folded_norms_equal_generate(data_dir: Path, prompts: list[tuple[int, ...]]) -> None:
    # The norms' weights folded into QKV and gate/up (what a GPU does in bf16, for its one-row
    # kernel), here through the CPU's paths: the greedy tokens and the logits stay transformers'.
    config = _config(data_dir, fold_norms="on")
    reference = _uneven_norms(load_model(config))
    wanted = _wanted(reference, reference_greedy(reference, prompts, MAX_NEW))
    engine = RecordingEngine(_uneven_norms(load_model(config)), config)
    try:
        layer = engine.runner.weights.layers[0]
        assert layer.input_norm is None
        assert layer.post_norm is None
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _alone(engine, requests) == wanted
        assert await _generated(engine, requests * 2, "crowd") == wanted * 2
        ids = prompts[0] + tuple(wanted[0])
        with torch.inference_mode():
            theirs = reference.model(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(engine.teacher_forced_logits(ids), theirs, atol=1e-4, rtol=0)
    finally:
        engine.close()


async def test_mixture_of_experts_equals_generate(
    data_dir: Path, prompts: list[tuple[int, ...]]
) -> None:
    # Hy-MT2-30B-A3B's architecture (the demo's: a dense first layer, then routed experts with a
    # shared one, query/key norms before RoPE): greedy tokens as generate()'s, alone and crowded.
    config = _config(data_dir, "hy-v3")
    reference = load_model(config)
    wanted = _wanted(reference, reference_greedy(reference, prompts, MAX_NEW))
    engine = RecordingEngine(load_model(config), config)
    try:
        assert engine.runner.weights.layers[1].moe is not None
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _alone(engine, requests) == wanted
        assert await _generated(engine, requests * 2, "crowd") == wanted * 2
    finally:
        engine.close()


async def test_results_text_budget_and_streaming(
    data_dir: Path, prompts: list[tuple[int, ...]]
) -> None:
    config = _config(data_dir)
    engine = FastEngine(load_model(config), config)
    try:
        loop = asyncio.get_running_loop()
        pieces: list[str] = []
        future: asyncio.Future[GenerationResult | ServiceError] = loop.create_future()
        engine.submit(
            "s",
            GenerationRequest(prompts[1], 5, GREEDY),
            lambda outcome, _q, _r: future.set_result(outcome),
            pieces.append,
        )
        result = await asyncio.wait_for(future, 60)
        assert isinstance(result, GenerationResult)
        assert result.completion_tokens <= 5
        assert result.prompt_tokens == len(prompts[1])
        assert pieces
        assert all(result.text.startswith(piece) for piece in pieces)
        # The same prompt again, one at a time: seen, then kept, then copied in; the answer
        # says how many of its prompt tokens were (whole blocks, never its last token).
        again = [
            (await submit_all(engine, [GenerationRequest(prompts[1], 5, GREEDY)], f"r{i}"))[0]
            for i in range(2)
        ]
        assert all(isinstance(r, GenerationResult) for r in again)
        cached = [r.cached_tokens for r in again if isinstance(r, GenerationResult)]
        assert cached == [0, PREFIX_BLOCK * ((len(prompts[1]) - 1) // PREFIX_BLOCK)]
        assert [r.text for r in again if isinstance(r, GenerationResult)] == [result.text] * 2
        # Too long for the model's positions: refused, not crashed.
        (refused,) = await submit_all(
            engine, [GenerationRequest((1,) * 40000, 5, GREEDY)], prefix="long"
        )
        assert isinstance(refused, ServiceError)
        assert engine.is_alive()
    finally:
        engine.close()
    assert not engine.is_alive()


async def test_cancelled_requests_leave_and_free_their_pages(
    data_dir: Path, prompts: list[tuple[int, ...]]
) -> None:
    config = _config(data_dir, max_rows=2)
    engine = FastEngine(load_model(config), config)
    try:
        called: list[str] = []
        for index in range(6):
            engine.submit(
                f"c{index}",
                GenerationRequest(prompts[index % len(prompts)], MAX_NEW, GREEDY),
                lambda *_args, i=index: called.append(f"c{i}"),
            )
        for index in range(6):
            engine.cancel(f"c{index}")
        # One more request afterwards still runs: the engine is not stuck on the cancelled.
        (result,) = await submit_all(engine, [GenerationRequest(prompts[0], 4, GREEDY)], "after")
        assert isinstance(result, GenerationResult)
        await asyncio.sleep(0.2)
        assert engine.pages.committed == 0
        assert engine.running() == 0
        # A cancelled request may have finished before its cancel arrived; none errs.
        assert set(called) <= {f"c{i}" for i in range(6)}
    finally:
        engine.close()


def test_the_rope_tables_keep_a_row_once_and_give_transformers_rows(data_dir: Path) -> None:
    # RoPE turns each pair of dimensions (i, i + half) by one angle: the tables keep a row's
    # first half only, and the rows the engine reads are transformers' own, to the bit.
    loaded = load_model(_config(data_dir))
    inner = loaded.model.model
    head_dim = loaded.model.config.hidden_size // loaded.model.config.num_attention_heads
    positions = torch.tensor([0, 1, 7, 300, loaded.model.config.max_position_embeddings - 1])
    probe = torch.zeros(1, 1, head_dim, dtype=loaded.dtype)
    cos, sin = inner.rotary_emb(probe, position_ids=positions[None])
    weights = take_weights(loaded.model, "none")
    assert weights.cos.shape == (weights.geometry.max_positions, head_dim // 2)
    got_cos, got_sin = weights.rope(positions)
    torch.testing.assert_close(got_cos, cos[0], rtol=0, atol=0)
    torch.testing.assert_close(got_sin, sin[0], rtol=0, atol=0)


def test_sampling_semantics() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 300)
    rows = 6
    # The greedy pick is argmax's: the first of tied maxima, across chunk boundaries too.
    tied = torch.randn(4, 3000).round(decimals=1)
    tied[0] = 0.0
    tied[1, [700, 2500]] = tied[1].max() + 1
    tied[2, [1030, 1020]] = tied[2].max() + 1
    assert torch.equal(first_argmax(tied), tied.argmax(dim=-1))
    assert first_argmax(tied)[1].item() == 700

    def params(**values: object) -> RowSampling:
        defaults: dict[str, object] = {
            "greedy": torch.zeros(rows, dtype=torch.bool),
            "temperature": torch.ones(rows),
            "top_k": torch.zeros(rows, dtype=torch.long),
            "top_p": torch.ones(rows),
            "penalty": torch.ones(rows),
            "seen": torch.zeros(rows, 300, dtype=torch.bool),
        }
        defaults.update(values)
        return RowSampling(**defaults)  # type: ignore[arg-type]

    greedy = logits.argmax(-1)
    # top-k 1 and a tiny top-p both reduce sampling to argmax, in both sorting paths.
    for full in (False, True):
        one = params(top_k=torch.ones(rows, dtype=torch.long))
        assert torch.equal(sample(logits, one, full), greedy)
        assert torch.equal(sample(logits, params(top_p=torch.full((rows,), 1e-6)), full), greedy)
    # Sampled tokens stay inside each row's top-k.
    top5 = logits.topk(5).indices
    for _ in range(20):
        drawn = sample(logits, params(top_k=torch.full((rows,), 5)), False)
        assert all(drawn[r] in top5[r] for r in range(rows))
    # The repetition penalty is transformers' own, greedy rows included.
    seen_ids = torch.randint(0, 300, (rows, 7))
    seen = torch.zeros(rows, 300, dtype=torch.bool).scatter(1, seen_ids, True)
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(seen_ids, logits.clone())
    chosen = sample(
        logits,
        params(
            greedy=torch.ones(rows, dtype=torch.bool), penalty=torch.full((rows,), 1.3), seen=seen
        ),
        False,
    )
    assert torch.equal(chosen, theirs.argmax(-1))


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 3 * FULL_SORT_ROWS + 7),
    seed=st.integers(0, 2**31 - 1),
    full=st.booleans(),
    engine_rows=st.sampled_from([1, 128, 256, 1024, 4096]),
)
def test_sampling_a_slice_of_rows_at_a_time_draws_what_one_pass_draws(
    rows: int, seed: int, full: bool, engine_rows: int
) -> None:
    # The full sort runs a slice of rows at a time to bound its buffers (an eighth of the
    # engine's rows, 16 to FULL_SORT_ROWS): with the same draws, each row's token is the one a
    # single pass over every row picks.
    at_once = full_sort_rows(engine_rows)
    assert 16 <= at_once <= FULL_SORT_ROWS
    generator = torch.Generator().manual_seed(seed)
    vocab = 50
    logits = torch.randn(rows, vocab, generator=generator) * 3
    params = RowSampling(
        greedy=torch.rand(rows, generator=generator) < 0.2,
        temperature=torch.rand(rows, generator=generator) + 0.3,
        top_k=torch.randint(0, 8, (rows,), generator=generator),
        top_p=torch.rand(rows, generator=generator) * 0.9 + 0.1,
        penalty=torch.rand(rows, generator=generator) + 1.0,
        seen=torch.rand(rows, vocab, generator=generator) < 0.1,
    )
    torch.manual_seed(seed)
    noise = race_noise(rows, vocab, full, logits.device)
    sliced = sample_rows(logits, params, full, noise, at_once)
    assert torch.equal(sliced, sample(logits, params, full, noise))


def test_fp8_projection_is_close_to_the_float_one() -> None:
    torch.manual_seed(0)
    weight = torch.randn(64, 32)
    x = torch.randn(5, 32)
    quantized = quantize_fp8(weight)
    assert quantized.weight.dtype == torch.float8_e4m3fn
    assert quantized.scale is not None
    assert quantized.scale.shape == (64, 1)
    dequantized = quantized.weight.float() * quantized.scale
    assert (dequantized - weight).abs().max() <= 0.07 * weight.abs().max()
    out = fp8_linear(x, quantized.weight, quantized.scale)
    assert out.shape == (5, 64)
    relative = (out - x @ weight.T).norm() / (x @ weight.T).norm()
    assert relative < 0.08
    # One row, compiled (a lone request's step): the weights read as they are, the activations
    # unquantized, so the product equals the dequantized weights' up to float rounding.
    one = torch.compile(linear, fullgraph=True)(x[:1], quantized.weight, quantized.scale)
    torch.testing.assert_close(one, x[:1] @ dequantized.T, rtol=1e-5, atol=1e-5)


async def test_fast_engine_serves_through_http(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(engine="fast", max_new_tokens=8, cache_size=0)
    health = (await client.http.get("/health")).json()
    assert health["engine"] == "fast"
    assert health["attention"] == "paged-gather"
    single, batch = await asyncio.gather(
        client.http.post("/translate", json={"text": "hello there", "target_lang": "de"}),
        client.http.post(
            "/batch_translate", json={"texts": ["short", "今天天气很好"], "target_lang": "fr"}
        ),
    )
    assert single.status_code == 200, single.text
    assert 0 < single.json()["usage"]["output_tokens"] <= 8
    assert batch.status_code == 200, batch.text
    assert len(batch.json()["translations"]) == 2


def test_every_weight_format_is_the_fast_engine_s(data_dir: Path) -> None:
    for quantization in ("none", "fp8", "nf4", "int8"):
        config = Settings(
            data_dir=data_dir, engine="fast", quantization=quantization, fast_num_pages=10
        ).engine_config()
        assert config.fast.num_pages == 10
        assert config.model.quantization == quantization


def _compressed_fp8_checkpoint(source: Path, target: Path) -> Path:
    """The demo model rewritten as Tencent's FP8 builds are: compressed-tensors, each decoder
    projection in float8 with one scale per output row, the rest as it was."""
    shutil.copytree(source, target)
    for path in target.glob("*.safetensors"):
        tensors = load_file(str(path))
        for name in [n for n in tensors if n.startswith("model.layers.") and "_proj." in n]:
            quantized = quantize_fp8(tensors[name])
            tensors[name] = quantized.weight
            assert quantized.scale is not None
            tensors[name.removesuffix(".weight") + ".weight_scale"] = quantized.scale
        save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text("utf-8"))
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**fp8, "strategy": "channel", "dynamic": False},
                "input_activations": {**fp8, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
    (target / "config.json").write_text(json.dumps(config), "utf-8")
    return target


async def test_compressed_tensors_fp8_checkpoint_runs_as_fp8_quantized_at_load(
    data_dir: Path, tmp_path: Path, prompts: list[tuple[int, ...]]
) -> None:
    folder = _compressed_fp8_checkpoint(ensure_demo_model(data_dir), tmp_path / "fp8")
    # bitsandbytes cannot quantize it again (transformers would see the FP8 values without their
    # scales): refused.
    with pytest.raises(RuntimeError, match="bitsandbytes does not quantize again"):
        load_model(_with(_config(data_dir), model_id=str(folder), quantization="nf4"))
    outputs = []
    # Both sources' projections marked for the tensor cores' fast accumulation when it is
    # asked for (which a CPU's product does not have: the same numbers here).
    for config in (
        _with(_config(data_dir, fp8_fast_accumulation=True), model_id=str(folder)),
        _with(_config(data_dir, fp8_fast_accumulation=True), quantization="fp8"),
    ):
        engine = RecordingEngine(load_model(config), config)
        try:
            assert engine.info.quantization == "fp8"
            qkv = engine.runner.weights.layers[0].qkv
            assert qkv.weight.dtype == torch.float8_e4m3fn
            assert qkv.fast_accum
            requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
            await submit_all(engine, requests, prefix="fp8")
            outputs.append([engine.tokens[f"fp8-{i}"] for i in range(len(requests))])
        finally:
            engine.close()
    # The same FP8 weights and scales, read from the checkpoint or quantized at load.
    assert outputs[0] == outputs[1]


def _dequantized(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` through row-wise FP8 and back: what an FP8 checkpoint of it holds."""
    quantized = quantize_fp8(weight)
    assert quantized.scale is not None
    return (quantized.weight.float() * quantized.scale).to(weight.dtype)


async def test_mixture_of_experts_fp8_checkpoint_reads_every_expert_with_its_scales(
    data_dir: Path, tmp_path: Path, prompts: list[tuple[int, ...]]
) -> None:
    # Hy-MT2-30B-A3B's FP8 build stores each routed expert (``experts.<e>.gate_proj``...) and the
    # shared one (``shared_mlp``, which transformers renames) in FP8 with its scales. Read from
    # the checkpoint: the shared expert FP8, the routed ones dequantized to the model's dtype,
    # the same as quantizing the original at load and rounding its experts through FP8.
    source = ensure_demo_model(data_dir, "hy-v3")
    folder = _compressed_fp8_checkpoint(source, tmp_path / "fp8-moe")
    base = _config(data_dir, "hy-v3")
    from_checkpoint = _with(base, model_id=str(folder))
    reference = load_model(_with(base, quantization="fp8"))
    for layer in reference.model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            for tensor in (experts.gate_up_proj, experts.down_proj):
                tensor.data = torch.stack([_dequantized(w) for w in tensor.data])
    engines = [
        RecordingEngine(load_model(from_checkpoint), from_checkpoint),
        RecordingEngine(reference, _with(base, quantization="fp8")),
    ]
    try:
        read, wanted = (engine.runner.weights.layers[1].moe for engine in engines)
        assert read is not None
        assert wanted is not None
        assert read.shared_gate_up.weight.dtype == torch.float8_e4m3fn
        assert torch.equal(read.shared_gate_up.weight, wanted.shared_gate_up.weight)
        assert torch.equal(read.gate_up, wanted.gate_up)
        assert torch.equal(read.down, wanted.down)
        outputs = []
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        for engine in engines:
            await submit_all(engine, requests, prefix="moe")
            outputs.append([engine.tokens[f"moe-{i}"] for i in range(len(requests))])
        assert outputs[0] == outputs[1]
    finally:
        for engine in engines:
            engine.close()


def test_one_scale_per_matrix_applies_to_every_row(tmp_path: Path) -> None:
    weight = torch.randn(8, 16)
    scale = weight.abs().max().reshape(1) / 448
    save_file(
        {"p.weight": (weight / scale).to(torch.float8_e4m3fn), "p.weight_scale": scale},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}}), "utf-8"
    )
    projection = Fp8Checkpoint.open(tmp_path).projection(["p"], torch.device("cpu"))
    assert projection.scale is not None
    assert projection.scale.shape == (8, 1)
    restored = projection.weight.float() * projection.scale
    assert (restored - weight).abs().max() <= 0.07 * weight.abs().max()


def test_a_memory_budget_sizes_the_cache_inside_it_and_refuses_what_cannot_fit(
    data_dir: Path,
) -> None:
    """``HYMT_GPU_MEMORY_GIB``: weights and KV cache stay inside the budget (a bigger budget, a
    bigger cache), and weights larger than the budget are refused with the way out named."""
    pages = []
    for budget_mib in (6, 12):
        config = _config(data_dir, num_pages=None, memory_gib=budget_mib / 1024)
        engine = FastEngine(load_model(config), config)
        try:
            runner = engine.runner
            used = runner.weights.nbytes() + engine.plan.pages * runner.cache.page_bytes
            assert used <= budget_mib * 2**20
            pages.append(engine.plan.pages)
        finally:
            engine.close()
    assert pages[1] > pages[0]
    tiny = _config(data_dir, num_pages=None, memory_gib=1 / 1024)  # 1 MiB: the weights take 3
    with pytest.raises(RuntimeError, match="HYMT_GPU_MEMORY_GIB"):
        FastEngine(load_model(tiny), tiny)


async def test_prefill_steps_in_fixed_shapes_equal_generate(
    data_dir: Path,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
) -> None:
    # The shapes a GPU captures its small prefill steps in (prefill_graphs.py), run uncaptured:
    # padded with a sequence of their own and empty ones, keys always read back, copies of the
    # scratch slot onto itself. Chunks of the long prompt, kept prefixes copied in, and crowds
    # of prompts in one step all go through them.
    config = _config(data_dir, prefill_tokens=32, prefill_graph_tokens=32, prefill_graph_rows=3)
    engine = RecordingEngine(load_model(config), config)
    try:
        graphs = engine.runner._prefill_graphs
        assert graphs is not None
        assert graphs.largest == 32
        assert engine.plan.prefill_graph_tokens == 32
        wanted = _wanted(reference, expected)
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _alone(engine, requests) == wanted
        assert await _generated(engine, requests * 4, "crowd") == wanted * 4
        assert engine.scheduler.prefixes is not None
        assert engine.scheduler.prefixes.reused_tokens > 0
        assert graphs.steps > 0
        assert engine.step_times().graph_prefills == graphs.steps
        # Behind a decode batch of fast_prefill_graph_rows rows the host's launches hide
        # behind the decode step: the prefill is not padded into a bucket.
        before = graphs.steps
        engine.runner._decoding = 3
        assert await _generated(engine, requests[:1], "wide") == wanted[:1]
        assert graphs.steps == before
    finally:
        engine.close()


async def test_prefill_slot_moves_by_the_engines_kernels_equal_generate(
    data_dir: Path,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
) -> None:
    # With the fused RoPE kernel (a GPU's 16-bit path; Triton's interpreter here) a prefill
    # writes its keys and values by that kernel, copies kept prefixes in and reads every
    # sequence's keys back by its own (slots.py; a captured step's padding, a slot copied onto
    # itself, is test_slots.py's): a crowd that sees two prompts three times each (a block
    # is kept at its second sighting, copied out to the kept pages, and copied in at its third).
    config = _config(data_dir, attention="gather", fused_rope="on")
    engine = RecordingEngine(load_model(config), config)
    try:
        assert engine.plan.fused_rope
        # Three tokens each (the interpreter is slow): the first is the prefill's, the rest
        # read the copied keys through the decode.
        requests = [GenerationRequest(p, 3, GREEDY) for p in prompts[:2]]
        wanted = [tokens[:3] for tokens in _wanted(reference, expected)[:2]]
        assert await _generated(engine, requests * 3, "crowd") == wanted * 3
        assert engine.scheduler.prefixes is not None
        assert engine.scheduler.prefixes.reused_tokens > 0
    finally:
        engine.close()


async def test_an_8_bit_kv_cache_serves_alone_and_in_a_crowd(
    data_dir: Path,
    reference: LoadedModel,
    prompts: list[tuple[int, ...]],
    expected: list[list[int]],
) -> None:
    # fast_kv_cache_dtype=fp8: keys and values are written to the cache in e4m3 and read back
    # in the model's dtype by the decode attention and by a prefill reusing kept prefixes (the
    # crowd's). The model differs from its 8-bit-cached self only in what the cache rounds.
    config = _config(data_dir, attention="gather", kv_cache_dtype="fp8")
    engine = RecordingEngine(load_model(config), config)
    try:
        cache = engine.runner.cache
        assert engine.plan.kv_cache_dtype == "float8_e4m3fn"
        assert {t.dtype for t in cache.keys + cache.values} == {KV_FP8}
        # A page takes a quarter of a float32 cache's bytes (the model's dtype on a CPU).
        assert cache.compute == reference.dtype == torch.float32
        geometry, layers = engine.runner.weights.geometry, len(cache.keys)
        assert cache.page_bytes * 4 == page_bytes(geometry, layers, cache.page_size, torch.float32)
        wanted = _wanted(reference, expected)
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        alone = await _alone(engine, requests)
        # Random weights make near-ties, which 8-bit keys and values tip: some texts part from
        # generate()'s at some token, most not (here 4 of 6 identical), and the first prompt's
        # first token, from a prefill that read no cached keys, is generate()'s.
        assert alone[0][0] == wanted[0][0]
        assert sum(got == want for got, want in zip(alone, wanted, strict=True)) >= 3
        crowd = await _generated(engine, requests * 4, "crowd")
        assert [len(tokens) for tokens in crowd] == [len(tokens) for tokens in alone] * 4
        assert engine.scheduler.prefixes is not None
        assert engine.scheduler.prefixes.reused_tokens > 0
        assert engine.pages.committed == 0
    finally:
        engine.close()


def test_an_8_bit_kv_cache_holds_more_pages_in_the_same_budget(data_dir: Path) -> None:
    # The fit sizes the cache by what a page of it takes: the same HYMT_GPU_MEMORY_GIB holds
    # about four times the float32 cache's pages (the workspace set aside is the same).
    pages = {}
    for kv in ("auto", "fp8"):
        config = _config(
            data_dir, num_pages=None, memory_gib=6 / 1024, attention="gather", kv_cache_dtype=kv
        )
        engine = FastEngine(load_model(config), config)
        try:
            pages[kv] = engine.plan.pages
        finally:
            engine.close()
    assert pages["fp8"] >= 3.5 * pages["auto"]


async def test_wide_batches_take_the_two_stage_top_k_when_asked(
    data_dir: Path, prompts: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # fast_topk_two_stage_rows: batches of at least that many rows sample through the
    # two-stage selection, narrower ones through the one selection.
    taken: list[tuple[int, bool]] = []
    real = sampler.sample_rows

    def recording(logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if "two_stage" in kwargs:  # a decode step's (a prefill's first tokens are not asked)
            taken.append((logits.shape[0], kwargs["two_stage"]))
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(runner_module, "sample_rows", recording)
    config = _config(data_dir, topk_two_stage_rows=2)
    engine = RecordingEngine(load_model(config), config)
    try:
        requests = [GenerationRequest(p, MAX_NEW, MODEL_CARD_DECODING) for p in prompts]
        await _generated(engine, requests[:1], "alone")
        await _generated(engine, requests, "crowd")
    finally:
        engine.close()
    assert {two_stage for rows, two_stage in taken if rows >= 2} == {True}
    assert {two_stage for rows, two_stage in taken if rows < 2} == {False}
