"""What the fast engine's settings resolve to on a device (``service/engine/fast/plan.py``)."""

from __future__ import annotations

import logging

import pytest
import torch

from service.config.engine import EngineSettings
from service.engine.capability import Capability
from service.engine.fast import prefill_graphs, quant_gemv
from service.engine.fast.cache import KV_FP8
from service.engine.fast.linear import Linear
from service.engine.fast.plan import (
    kv_dtype_for,
    plan_for,
    prefill_graph_tokens_for,
    prefill_warmups,
)

CUDA = torch.device("cuda")  # only named here: resolving a plan calls nothing on the device


def _graphs(dtype: torch.dtype, moe: bool, setting: str = "auto") -> bool:
    config = EngineSettings(cuda_graph=setting, attention="flex")
    _rows, _prefill, graphs, _compiled, _attention = plan_for(config, CUDA, dtype, moe)
    return graphs


def test_a_mixture_of_experts_is_captured_in_graphs_in_bf16_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Outside bf16 the experts' grouped GEMM reads its row counts back to the host, which a
    # graph's capture cannot take: the engine then decodes without graphs, and says so.
    assert _graphs(torch.bfloat16, moe=True)
    assert _graphs(torch.float32, moe=False)
    with caplog.at_level(logging.WARNING, logger="service.engine.fast.plan"):
        assert not _graphs(torch.float32, moe=True)
        assert not _graphs(torch.float16, moe=True)
    assert [r.getMessage() for r in caplog.records].count(
        "decode graphs off: a mixture-of-experts model's grouped GEMM runs in bfloat16 only"
    ) == 2
    with pytest.raises(RuntimeError, match="cannot capture; use bfloat16"):
        _graphs(torch.float32, moe=True, setting="on")
    assert not _graphs(torch.bfloat16, moe=True, setting="off")


def test_the_prefill_compiles_before_ready_for_every_branch_a_chunk_can_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The prompt count turns dynamic at its second size; bitsandbytes weights on a GPU take
    # other branches past their bounds (int8's INT8_ROWS tokens), compiled too where a chunk
    # can get there; 4-bit codes take a kernel of their own up to a few rows, a count of which
    # compiles too (without it, a prompt's few uncached tokens compiled while requests waited),
    # and the tensor cores' kernel up to FOUR_BIT_MATMUL_ROWS where set (a wide weight's bounds:
    # test_quant_gemv).
    int8 = quant_gemv.branches(_linear(code=False))
    bound = quant_gemv.INT8_ROWS
    assert quant_gemv.branches(Linear(torch.zeros(64, 64, dtype=torch.bfloat16))) == ()
    assert prefill_warmups((), 8192, 4096, 128) == [1, 16, 17]
    assert prefill_warmups(int8, 8192, 4096, 128) == [1, 16, 17, bound + 1]
    assert prefill_warmups(int8, bound, 4096, 128) == [1, 16, 17]  # chunks never get there
    assert prefill_warmups(int8, 8192, 1, 128) == [1, 16, 17]  # a cache too small to try
    few = quant_gemv.FOUR_BIT_ROWS_TAKEN
    monkeypatch.setattr(quant_gemv, "FOUR_BIT_MATMUL_ROWS", 0)
    nf4 = quant_gemv.branches(_linear(code=True))
    assert prefill_warmups(nf4, 8192, 4096, 128) == sorted({1, few, 16, 17})
    monkeypatch.setattr(quant_gemv, "FOUR_BIT_MATMUL_ROWS", 256)
    nf4 = quant_gemv.branches(_linear(code=True))
    assert prefill_warmups(nf4, 8192, 4096, 128) == sorted({1, few, 16, 17, 257})


def _linear(code: bool) -> Linear:
    """A bitsandbytes weight's stand-in: int8 values, or 4-bit codes with their table."""
    weight = torch.zeros(64, 32 if code else 64, dtype=torch.uint8 if code else torch.int8)
    return Linear(weight, torch.ones(64, 1), torch.zeros(16) if code else None)


def test_uncompiled_flex_attention_never_goes_into_a_decode_graph(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Uncompiled, FlexAttention makes tensors from host values at every call, and a graph's
    # capture refused it on an H100 (run 69's smoke): such an engine decodes without graphs,
    # or with the Triton kernel for every batch (the runner's ``flex_in_graphs``).
    def plan(attention: str, graphs: str) -> tuple[bool, str]:
        config = EngineSettings(cuda_graph=graphs, attention=attention, compile="off")
        _rows, _prefill, graphed, _compiled, chosen = plan_for(config, CUDA, torch.bfloat16, False)
        return graphed, chosen

    with caplog.at_level(logging.WARNING, logger="service.engine.fast.plan"):
        assert plan("flex", "auto") == (False, "flex")
    assert "decode graphs off: uncompiled FlexAttention cannot be captured" in caplog.messages
    with pytest.raises(RuntimeError, match="needs fast_compile"):
        plan("flex", "on")
    assert plan("triton", "auto") == (True, "triton")


def test_small_prefill_steps_are_captured_where_the_decode_is_and_a_varlen_kernel_runs() -> None:
    # Attention split on the host (no varlen kernel: a CPU, float32) cannot be captured.
    assert prefill_graph_tokens_for(None, graphs=True, capturable=True, chunk=8192) == 2048
    assert prefill_graph_tokens_for(None, graphs=True, capturable=True, chunk=16384) == 2048
    assert prefill_graph_tokens_for(None, graphs=True, capturable=True, chunk=1024) == 256
    assert prefill_graph_tokens_for(None, graphs=True, capturable=False, chunk=8192) == 0
    assert prefill_graph_tokens_for(None, graphs=False, capturable=True, chunk=8192) == 0
    assert prefill_graph_tokens_for(0, graphs=True, capturable=True, chunk=8192) == 0
    assert (
        prefill_graph_tokens_for(64, graphs=False, capturable=False, chunk=8192, cuda=False) == 64
    )
    with pytest.raises(RuntimeError, match="needs a varlen prefill kernel"):
        prefill_graph_tokens_for(64, graphs=True, capturable=False, chunk=8192, cuda=True)


def test_a_failed_prefill_capture_costs_speed_never_the_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*args: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(prefill_graphs, "PrefillGraphs", refused)
    with caplog.at_level(logging.WARNING, logger="service.engine.fast.prefill_graphs"):
        assert prefill_graphs.capture(lambda packed: packed.tokens, 64, CUDA, False) is None
    assert "prefill graphs off: the capture failed" in caplog.messages
    with pytest.raises(RuntimeError, match="capturing"):  # the operator asked for them
        prefill_graphs.capture(lambda packed: packed.tokens, 64, CUDA, True)
    assert prefill_graphs.capture(lambda packed: packed.tokens, 8, CUDA, True) is None  # no bucket


def test_an_8_bit_kv_cache_is_taken_only_where_its_attention_reads_it() -> None:
    hopper, ampere, cpu = Capability(True, (9, 0)), Capability(True, (8, 6)), Capability(False)
    bf16 = torch.bfloat16
    assert kv_dtype_for("auto", bf16, hopper, "triton") == bf16  # the model's, by default
    assert kv_dtype_for("auto", torch.float32, cpu, "gather") == torch.float32
    assert kv_dtype_for("fp8", bf16, hopper, "triton") == KV_FP8
    assert kv_dtype_for("fp8", torch.float32, cpu, "gather") == KV_FP8  # tests drive it here
    # FlexAttention multiplies the cache as it is stored; before 8.9 no FP8 conversions.
    for capability, attention in ((hopper, "flex"), (ampere, "triton"), (cpu, "flex")):
        with pytest.raises(RuntimeError, match="fast_kv_cache_dtype=fp8"):
            kv_dtype_for("fp8", bf16, capability, attention)


def test_cuda_decodes_2048_rows_unless_told_otherwise() -> None:
    # A full round of 2,048 rows yields more tokens a second than one of 1,024; the operator's
    # figure stands, and a CPU keeps its 64.
    config = EngineSettings(attention="flex")
    assert plan_for(config, CUDA, torch.bfloat16, False)[0] == 2048
    assert plan_for(config, torch.device("cpu"), torch.float32, False)[0] == 64
    told = EngineSettings.model_validate({"attention": "flex", "fast_max_rows": 1024})
    assert plan_for(told, CUDA, torch.bfloat16, False)[0] == 1024
