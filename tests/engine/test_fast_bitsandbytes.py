"""The fast engine serves bitsandbytes weights (nf4, int8) as transformers loaded them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from loadtests.fidelity import RecordingEngine, dequantized_copy, reference_greedy
from service.contract.types import GenerationRequest
from service.engine.fast.linear import Linear, dequantize, linear
from service.engine.fast.weights import take_weights
from service.engine.loading import load_model
from tests.engine.test_fast import (
    GREEDY,
    MAX_NEW,
    TEXTS,
    _alone,
    _config,
    _generated,
    _wanted,
    _with,
)


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
@pytest.mark.parametrize("lm_head", [False, True], ids=["head-plain", "head-quantized"])
async def test_bitsandbytes_weights_give_their_model_s_greedy_tokens(
    quantization: str, lm_head: bool, data_dir: Path
) -> None:
    # The reference is transformers' generate() over the very numbers bitsandbytes stored,
    # dequantized by bitsandbytes itself (for int8, weight-only: the engine keeps activations in
    # their dtype where LLM.int8() would round them to int8).
    config = _with(_config(data_dir), quantization=quantization, quantize_lm_head=lm_head)
    loaded = load_model(config)
    prompts = [tuple(loaded.tokenizer.encode(text)) for text in TEXTS]
    reference = dequantized_copy(load_model(config))
    wanted = _wanted(reference, reference_greedy(reference, prompts, MAX_NEW))
    engine = RecordingEngine(loaded, config)
    try:
        weights = engine.runner.weights
        layer = weights.layers[0]
        kind = torch.uint8 if quantization == "nf4" else torch.int8
        assert layer.qkv.weight.dtype == kind
        assert layer.down is not None
        assert layer.down.weight.dtype == kind
        assert (weights.lm_head.weight.dtype == kind) == lm_head
        assert engine.info.quantization == quantization + ("+lm_head" if lm_head else "")
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _alone(engine, requests) == wanted
        assert await _generated(engine, requests * 2, "crowd") == wanted * 2
        assert engine.pages.committed == 0
    finally:
        engine.close()


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_a_device_with_the_wide_tile_s_memory_marks_every_4_bit_projection(
    quantization: str, data_dir: Path
) -> None:
    # take_weights(wide_four_bit=...) is the device's choice (Capability.wide_four_bit) carried
    # to the products: every 4-bit projection, the output layer's too, marked; int8 never.
    config = _with(_config(data_dir), quantization=quantization, quantize_lm_head=True)
    for wide in (False, True):
        weights = take_weights(load_model(config).model, quantization, wide_four_bit=wide)
        projections: list[Linear | None] = [weights.lm_head]
        for layer in weights.layers:
            projections += [layer.qkv, layer.o, layer.gate_up, layer.down]
        assert all(p is not None and p.bitsandbytes for p in projections)
        marked = {p.wide_tile for p in projections if p is not None}
        assert marked == {wide and quantization == "nf4"}


def _four_bit_layer(out: int, inputs: int, seed: int) -> tuple[nn.Linear, torch.Tensor]:
    """A Linear4bit-like layer (what transformers leaves after loading: packed codes with their
    quant state) of random weights, and what bitsandbytes dequantizes it to."""
    import bitsandbytes.functional as bnb_functional

    weight = torch.randn(out, inputs, generator=torch.Generator().manual_seed(seed))
    packed, state = bnb_functional.quantize_4bit(
        weight, blocksize=64, quant_type="nf4", compress_statistics=True
    )
    module = nn.Linear(inputs, out, bias=False)
    module.weight = nn.Parameter(packed, requires_grad=False)
    module.weight.quant_state = state  # type: ignore[attr-defined]
    return module, bnb_functional.dequantize_4bit(packed, state)


@pytest.mark.parametrize(
    "outs",
    [(64, 32, 32), (64, 24), (24, 24)],
    ids=["maxima-8-bit", "mixed", "maxima-float32"],
)
def test_nf4_codes_dequantize_as_bitsandbytes_does(outs: tuple[int, ...]) -> None:
    # 512 inputs: 8 blocks a row, so 32 or more rows fill the groups of 256 maxima that
    # bitsandbytes' double quantization scales together; 24 rows do not.
    from service.engine.fast import bnb

    layers = [_four_bit_layer(out, 512, seed) for seed, out in enumerate(outs)]
    taken = bnb.projection([module for module, _ in layers])
    theirs = torch.cat([values for _, values in layers])
    assert taken.weight.shape == (sum(outs), 256)
    assert taken.scale is not None
    kept = all(out % 32 == 0 for out in outs)
    assert (taken.nested is not None) == kept
    assert taken.scale.dtype == (torch.uint8 if kept else torch.float32)
    ours = dequantize(taken.weight, taken.scale, taken.code, torch.float32, taken.nested)
    assert torch.equal(ours, theirs)
    x = torch.randn(3, 512)
    product = linear(x, taken.weight, taken.scale, taken.code, taken.nested)
    torch.testing.assert_close(product, x @ theirs.T)
    assert isinstance(taken, Linear)
    assert taken.bitsandbytes
    # Half a byte per weight, and a byte (8-bit maxima) or four per block of 64, and the
    # tables: 16 codes, and with 8-bit maxima their 256 values and two floats per group.
    per_block = 1 if kept else 4
    tables = 16 * 4 + (256 * 4 + theirs.numel() // 64 // 256 * 8 if kept else 0)
    assert taken.nbytes() == theirs.numel() // 2 + theirs.numel() // 64 * per_block + tables


async def test_compiled_nf4_step_gives_the_same_tokens(data_dir: Path) -> None:
    # What a GPU runs, less the graphs: the decode step compiled by inductor, where a lone row
    # reads the codes inside the product's reduction (``row_product``) and a batch dequantizes
    # before its GEMM; the tokens are the eager engine's.
    base = _with(_config(data_dir, attention="gather", max_rows=2), quantization="nf4")
    compiled = _with(
        _config(data_dir, attention="gather", max_rows=2, compile="on"), quantization="nf4"
    )
    loaded = load_model(base)
    prompts = [tuple(loaded.tokenizer.encode(text)) for text in TEXTS[:3]]
    requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
    eager = RecordingEngine(loaded, base)
    try:
        wanted = await _alone(eager, requests)
    finally:
        eager.close()
    engine = RecordingEngine(load_model(compiled), compiled)
    try:
        assert engine.plan.compiled
        assert await _alone(engine, requests) == wanted
        assert await _generated(engine, requests * 2, "crowd") == wanted * 2
    finally:
        engine.close()


async def test_a_checkpoint_saved_quantized_is_served_as_it_was_saved(
    data_dir: Path, tmp_path: Path
) -> None:
    # The article's readers download a 4-bit checkpoint as often as they quantize at load: one
    # saved by bitsandbytes is read as it is (no HYMT_QUANTIZATION), reported as nf4, and gives
    # its dequantized numbers' tokens.
    quantized = load_model(_with(_config(data_dir), quantization="nf4"))
    # The output layer as the checkpoint had it (the service pads its rows once loaded).
    padded: Any = quantized.model.get_output_embeddings()  # type: ignore[no-untyped-call]
    plain = nn.Linear(padded.inner.in_features, padded.rows, bias=False)
    plain.weight = nn.Parameter(padded.inner.weight.data[: padded.rows], requires_grad=False)
    quantized.model.set_output_embeddings(plain)  # type: ignore[no-untyped-call]
    folder = tmp_path / "nf4-checkpoint"
    quantized.model.save_pretrained(folder)
    quantized.tokenizer.save_pretrained(folder)
    config = _with(_config(data_dir), model_id=str(folder))
    loaded = load_model(config)
    assert loaded.quantization == "nf4"
    prompts = [tuple(loaded.tokenizer.encode(text)) for text in TEXTS[:3]]
    reference = dequantized_copy(load_model(config))
    wanted = _wanted(reference, reference_greedy(reference, prompts, MAX_NEW))
    engine = RecordingEngine(loaded, config)
    try:
        assert engine.info.quantization == "nf4"
        assert engine.runner.weights.layers[0].qkv.weight.dtype == torch.uint8
        requests = [GenerationRequest(p, MAX_NEW, GREEDY) for p in prompts]
        assert await _alone(engine, requests) == wanted
    finally:
        engine.close()
