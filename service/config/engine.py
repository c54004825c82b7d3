"""The engine's settings (``EngineSettings``) and all the engine process receives
(``EngineConfig``): the model and engine sub-models as they are, with what the edge derived from
the model family. Frozen, so it crosses the process boundary as one pickled value."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from service.config.kinds import ChatFormat, EngineKind, LogLevel, Toggle
from service.config.model import ModelSettings
from service.config.section import Section
from service.contract.protocol import Peer
from service.contract.types import MODEL_CARD_DECODING, Decoding, Engine


class EngineSettings(Section):
    """The fast engine: its paged cache, batch rows, prefill chunk, graphs and kernels."""

    kind: EngineKind = Field(
        "auto",
        alias="engine",
        description="The serving engine: fast, the project's own (paged KV cache, decode steps "
        "as CUDA graphs on a GPU), on every device and for every weight format (auto = fast).",
    )
    page_size: int = Field(
        128,
        ge=16,
        alias="fast_page_size",
        description="Tokens per KV-cache page (a multiple of 16).",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto",
        alias="fast_kv_cache_dtype",
        description="What the KV cache stores keys and values in: auto = the model's dtype; "
        "fp8 = 8-bit e4m3 (scale 1, as vLLM's uncalibrated FP8 cache), half the bytes: twice "
        "the tokens in the same memory and half the reads of a decode step's attention, at "
        "8-bit precision. On CUDA it needs compute capability 8.9+ and a 16-bit model (the "
        "Triton decode attention reads it); on a CPU it runs everywhere.",
    )
    num_pages: int | None = Field(
        None,
        ge=2,
        alias="fast_num_pages",
        description="KV-cache pages, an explicit memory budget (unset: fast_memory_fraction of "
        "the memory free after loading, the GPU's or on a CPU the host's).",
    )
    prefix_cache_tokens: int | None = Field(
        None,
        ge=0,
        alias="fast_prefix_cache_tokens",
        description="KV-cache tokens set aside for prompt prefixes seen more than once (the "
        "template before the text, a repeated glossary or context), whose keys and values are "
        "then copied instead of computed again; 0 turns it off. Unset: 4,096 tokens, at most a "
        "sixteenth of the cache.",
    )
    memory_gib: float | None = Field(
        None,
        gt=0,
        alias="gpu_memory_gib",
        description="The most memory the engine may take, in GiB: weights, KV cache, graphs "
        "and workspace (a 16 or 24 GiB card, or a share of a larger one). The engine sizes its "
        "cache and rows inside it, says at start what fits, and refuses to start when the "
        "weights alone do not fit. Unset: the device's free memory.",
    )
    memory_fraction: float = Field(
        0.85,
        gt=0,
        lt=1,
        alias="fast_memory_fraction",
        description="Share of the memory free after loading that the KV cache takes, once the "
        "widest step's sampling buffers and prefill activations are set aside.",
    )
    max_rows: int | None = Field(
        None,
        ge=1,
        le=4096,
        alias="fast_max_rows",
        description="Most requests decoding at once (unset: 2,048 on CUDA, halved until the KV "
        "cache holds 128 tokens a row, after the prefill chunk; 64 elsewhere); more wait inside "
        "the engine.",
    )
    prefill_tokens: int | None = Field(
        None,
        ge=16,
        alias="fast_prefill_tokens",
        description="Most prompt tokens per prefill step; a longer prompt is prefilled in "
        "chunks between decode steps (unset: 8,192 on CUDA, halved down to 2,048 before the "
        "rows are where the KV cache would not hold 128 tokens a row; 512 elsewhere).",
    )
    prefill_graph_tokens: int | None = Field(
        None,
        ge=0,
        le=8192,
        alias="fast_prefill_graph_tokens",
        description="Prefill steps of up to this many tokens (at most 2,048) run as CUDA "
        "graphs, one per size 64 tokens apart (128 past 1,024): one launch instead of every "
        "layer's operations from the host, which is slower than a fast card's decode step "
        "(unset: a quarter of the prefill chunk, at most 2,048, where the decode steps are "
        "graphs and the prefill takes the flash kernel; 0: never). Set on a CPU, the same "
        "shapes run uncaptured.",
    )
    prefill_graph_rows: int | None = Field(
        None,
        ge=1,
        alias="fast_prefill_graph_rows",
        description="A prefill step replays its graph only behind a decode batch of fewer "
        "rows than this, and takes the uncaptured prefill behind a wider one, whose decode step "
        "may outlast the host's launching of the prefill layer by layer while a bucket's "
        "padding computes tokens for nothing (unset: behind every batch).",
    )
    cuda_graph: Toggle = Field(
        "auto",
        alias="fast_cuda_graph",
        description="Decode steps as CUDA graphs (auto = on CUDA, but for a mixture-of-experts "
        "model outside bf16, whose grouped GEMM reads back to the host).",
    )
    compile: Toggle = Field(
        "auto",
        alias="fast_compile",
        description="torch.compile of the decode layer and its attention (auto = on CUDA); "
        "compiled kernels are cached under data_dir/compile-cache.",
    )
    compile_scope: Literal["layer", "step"] = Field(
        "layer",
        alias="fast_compile_scope",
        description="What one compiled unit covers: layer = one decode layer, reused by all "
        "(quick to compile); step = the whole stack (inductor may fuse across layers).",
    )
    decode_shapes: Literal["static", "dynamic"] = Field(
        "static",
        alias="fast_decode_shapes",
        description="static compiles the decode step once per batch-size bucket (kernels "
        "specialised to each size; a cold start compiles longer); dynamic compiles the largest "
        "bucket for its size and one graph with a symbolic batch size for the others.",
    )
    fused_rope: Toggle = Field(
        "auto",
        alias="fast_fused_rope",
        description="Each decode layer's RoPE, query/key norms and KV-cache writes as one "
        "Triton kernel, and a prefill's with its copies of kept prefixes and its reads of the "
        "cache as one kernel each: auto where it runs (bf16 or fp16 on CUDA); on forces it "
        "(refusing to start without Triton); off keeps the compiled torch code.",
    )
    topk_two_stage_rows: int | None = Field(
        None,
        ge=1,
        alias="fast_topk_two_stage_rows",
        description="Decode batches of at least this many rows take each row's top 64 logits "
        "in two stages (the top 64 of every 1,024, then of those) instead of one selection over "
        "the whole vocabulary. Unset: never; at 256 rows and up with fast_fp8_fast_accumulation it "
        "changed nothing measurable in an H100's FP8 steady state of 2,048 rows.",
    )
    fp8_fast_accumulation: bool = Field(
        False,
        alias="fast_fp8_fast_accumulation",
        description="FP8 weights' batch products accumulate in the tensor cores' own precision "
        "throughout (torch._scaled_mm's use_fast_accum) instead of in float32 along the way: "
        "faster for the products alone (docs/benchmarks.md, run 104), a little less exact. Off by "
        "default: with fast_topk_two_stage_rows=256 it changed nothing measurable in an H100's "
        "FP8 steady state of 2,048 rows; its fidelity on the 7B is not measured.",
    )
    pdl: Toggle = Field(
        "auto",
        alias="fast_pdl",
        description="A lone request's decode layers launch the engine's own kernels with "
        "programmatic dependent launch inside the CUDA graph. Needs the fused RoPE, every norm "
        "folded (a dense model), the Triton decode attention, compute capability 9.0+ and "
        "Triton 3.4+ (auto: where all of that holds; on: refuses to start otherwise).",
    )
    fold_norms: Toggle = Field(
        "auto",
        alias="fast_fold_norms",
        description="Fold each RMSNorm's weight into the projection after it, so a lone "
        "request's one-row kernel applies the norm itself. auto: where every norm folds (a "
        "dense model, not an FP8 checkpoint) and a lone request's layers launch with PDL; on: "
        "also elsewhere. Rounds the folded weights once more.",
    )
    capability: str | None = Field(
        None,
        alias="fast_capability",
        pattern=r"^\d+(\.\d+)?$",
        description="Choose dtype and kernels as if the GPU had this older compute capability "
        "(e.g. 7.5, a T4's: float16, the memory-efficient varlen prefill kernel, no FP8, no "
        "wide 4-bit tile), to run and measure the fallback kernels on a newer GPU; unset: the "
        "GPU's own.",
    )
    attention: Literal["auto", "triton", "flex", "gather"] = Field(
        "auto",
        alias="fast_attention",
        description="Decode attention. triton = the engine's own kernel for batches of up to "
        "fast_triton_attention_rows rows, FlexAttention above; flex = FlexAttention over the "
        "paged cache; gather = each row's pages copied out for SDPA (exact, slower); auto = "
        "triton for bf16 or fp16 on CUDA, flex for float32 on CUDA, gather elsewhere.",
    )
    triton_attention_rows: int | None = Field(
        None,
        ge=1,
        alias="fast_triton_attention_rows",
        description="The largest decode batch that takes the Triton decode attention; larger "
        "batches take FlexAttention. Unset: measured on the GPU at start (both kernels timed "
        "at the batch sizes above 16; the largest at which the Triton kernel is as fast).",
    )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What to load, how to drive it, and how often to report."""

    model: ModelSettings = field(default_factory=ModelSettings)
    fast: EngineSettings = field(default_factory=EngineSettings)
    # The turn format of the model's family and size: picks the demo model (and the demo
    # tokenizer of a ``dummy`` load) when no model is given.
    chat_format: ChatFormat = "hunyuan-7b"
    # The config in ``configs/`` a ``dummy`` load builds when no model is given.
    shipped_config: str = "hunyuan-mt-7b"
    # Whether the chat template's generation prompt follows the user turn.
    add_generation_prompt: bool = False
    decoding: Decoding = MODEL_CARD_DECODING
    max_new_tokens: int = 1024
    log_level: LogLevel = "info"
    stats_interval_s: float = 0.1


# The engine process's entry: serves the API processes at ``peers`` (the first started it) with
# the engine ``config`` describes, until told to stop. Picklable: spawn sends it by reference.
# The edge builds it (``service.wiring``), so the API process's own code never names the engine.
EngineEntry = Callable[[EngineConfig, Sequence[Peer]], None]
# Builds the engine inside the engine process; must be picklable (spawn sends it by reference).
EngineLoader = Callable[[EngineConfig], Engine]
