"""The engine process's own configuration: all it receives of the service's settings.

Plain frozen dataclasses, so they cross the process boundary (multiprocessing spawn pickles
them) and carry nothing of the HTTP side. ``Settings.engine_config()`` builds them at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from service.engine.types import MODEL_CARD_DECODING, Decoding

EngineKind = Literal["auto", "static", "continuous", "fast"]
Toggle = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How the static engine forms micro-batches (inside the engine process)."""

    max_batch_size: int = 32
    max_batch_tokens: int = 32768
    max_wait_s: float = 0.005


@dataclass(frozen=True, slots=True)
class ContinuousConfig:
    """transformers' continuous batching: kernels, graphs and the KV-cache budget."""

    attention: Literal["auto", "varlen", "sdpa"] = "auto"
    cuda_graph: Toggle = "auto"
    kv_padding: int | None = None
    max_batch_tokens: int | None = None
    max_requests_per_batch: int | None = None
    compile_level: int = 0
    max_memory_percent: float | None = None
    # KV-cache pages (of transformers' block size); None sizes the cache from free memory.
    num_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class FastConfig:
    """The fast engine: its paged cache, batch rows, prefill chunk, graphs and kernels."""

    page_size: int = 128
    # KV-cache pages; None sizes the cache from free GPU memory (required on a CPU).
    num_pages: int | None = None
    memory_fraction: float = 0.85
    # Rows of the decode batch; None: 1,024 on CUDA, 64 elsewhere.
    max_rows: int | None = None
    # Most prompt tokens per prefill step; None: 8,192 on CUDA, 512 elsewhere.
    prefill_tokens: int | None = None
    cuda_graph: Toggle = "auto"
    compile: Toggle = "auto"
    # What one compiled unit covers: a decode layer (reused by all) or the whole stack of them.
    compile_scope: Literal["layer", "step"] = "layer"
    # Decode shapes compiled per batch-size bucket (static) or one graph with the batch size
    # symbolic after the first two buckets (dynamic; slower for the batches between them).
    decode_shapes: Literal["static", "dynamic"] = "static"
    # Norm weights folded into the next projection: auto where every norm folds and a lone
    # request's layers launch with PDL, passing the sums between projections (dense 16-bit
    # models on CUDA); the other folded steps measured slower than the norm kernels.
    fold_norms: Toggle = "auto"
    attention: Literal["auto", "triton", "flex", "gather"] = "auto"
    # The decode layer's RoPE, query/key norms and cache writes as one Triton kernel: auto
    # takes it where it runs (16-bit on CUDA).
    fused_rope: Toggle = "auto"
    # A lone request's decode layers launched eagerly with programmatic dependent launch (in
    # the graph): auto where that step runs the engine's kernels only (fused RoPE, norms
    # folded into a dense model, the Triton attention; compute capability 9.0+).
    pdl: Toggle = "auto"
    # Batches of up to this many rows take the Triton decode attention (``triton``).
    triton_attention_rows: int = 16


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What to load, how to drive it, and how often to report."""

    model_id: str | None = None
    model_revision: str | None = None
    # The turn format of the model's family and size: picks the demo model (and the demo
    # tokenizer of a ``dummy`` load) when no model is given.
    chat_format: Literal["hunyuan-7b", "hy", "hy-v3"] = "hunyuan-7b"
    # The config in ``configs/`` a ``dummy`` load builds when no model is given.
    shipped_config: str = "hunyuan-mt-7b"
    # Whether the chat template's generation prompt follows the user turn.
    add_generation_prompt: bool = False
    load_format: Literal["auto", "dummy"] = "auto"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: Literal["none", "nf4", "int8", "fp8"] = "none"
    quantize_lm_head: bool = False
    device: Literal["auto", "cuda", "cpu"] = "auto"
    compile_norms: Toggle = "auto"
    data_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "hunyuan-mt-service")
    engine: EngineKind = "auto"
    decoding: Decoding = MODEL_CARD_DECODING
    max_new_tokens: int = 1024
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    continuous: ContinuousConfig = field(default_factory=ContinuousConfig)
    fast: FastConfig = field(default_factory=FastConfig)
    # Settings given explicitly that only one engine kind reads: checked once the kind is known.
    static_only: tuple[str, ...] = ()
    continuous_only: tuple[str, ...] = ()
    fast_only: tuple[str, ...] = ()
    log_level: str = "info"
    stats_interval_s: float = 0.1

    def check_kind(self, kind: str) -> None:
        """Refuse settings that the chosen engine would silently ignore."""
        unused = {
            "static": self.continuous_only + self.fast_only,
            "continuous": self.static_only + self.fast_only,
            "fast": self.static_only + self.continuous_only,
        }[kind]
        if self.quantization == "fp8" and kind != "fast":
            raise ValueError("quantization=fp8 is the fast engine's (HYMT_ENGINE=fast)")
        if self.quantization in ("nf4", "int8") and kind == "fast":
            raise ValueError(
                f"the fast engine does not run bitsandbytes {self.quantization}; "
                "use quantization=fp8 or none"
            )
        if unused:
            raise ValueError(
                f"the {kind} engine does not use {', '.join(sorted(unused))}; "
                "remove them or choose the engine they belong to (HYMT_ENGINE)"
            )
