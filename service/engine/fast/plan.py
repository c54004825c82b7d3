"""What the fast engine runs on this device: its settings (``EngineSettings``) resolved against
the device, the dtype and the model into rows, prefill chunk, graphs, compile, the decode
attention and the lone request's kernels (fused RoPE, folded norms, PDL), and the ``Plan`` that
/health and the logs report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from service.config.engine import EngineSettings
from service.engine.capability import Capability
from service.engine.fast import gemv, launch, rope
from service.engine.fast.attention import triton_runs
from service.engine.fast.cache import KV_FP8
from service.engine.fast.checkpoint import Fp8Checkpoint
from service.engine.fast.pages import pages_for
from service.engine.loading import LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the engine settled on at load: the figures /health and the logs report."""

    rows: int
    page_size: int
    pages: int
    prefill_tokens: int
    attention: str
    cuda_graphs: bool
    compiled: bool
    buckets: tuple[int, ...]
    # "static" (a compile per bucket) or "dynamic"; "eager" when nothing is compiled.
    decode_shapes: str
    # Whether the decode layers run RoPE, the query/key norms and the cache writes as one
    # kernel (rope.py).
    fused_rope: bool
    # Whether a lone request's layers launch with programmatic dependent launch (launch.py).
    one_row_pdl: bool
    # The largest decode batch the Triton attention serves (set, or measured at start:
    # attention_choice.py); 0 where it serves none.
    triton_rows: int = 0
    # The largest prefill step run as a CUDA graph (prefill_graphs.py); 0 where none is.
    prefill_graph_tokens: int = 0
    # What the KV cache stores keys and values in (``kv_dtype_for``).
    kv_cache_dtype: str = ""
    # What the fit set aside for the widest steps (``cache.Fitted.workspace``), to set beside
    # what they took (the allocator's peak at ready less its reserve after the cache).
    workspace_gib: float = 0.0


# Decode rows on CUDA where the operator sets none (``plan_for``).
DEFAULT_CUDA_ROWS = 2048


def plan_for(
    config: EngineSettings, device: torch.device, dtype: torch.dtype, moe: bool
) -> tuple[int, int, bool, bool, str]:
    """Rows, prefill chunk, graphs, compile and the attention backend on ``device``, for a
    model with mixture-of-experts blocks where ``moe``."""
    cuda = device.type == "cuda"
    # On CUDA a full FP8 round of 2,048 rows yields more tokens a second than one of 1,024
    # (docs/benchmarks.md): the round's prefill multiplies twice the tokens at once too. The
    # fit halves the rows where the cache could not fill them.
    rows = config.max_rows or (DEFAULT_CUDA_ROWS if cuda else 64)
    prefill = config.prefill_tokens or (8192 if cuda else 512)
    # The experts' grouped GEMM has a CUDA kernel for bf16 only; in another dtype torch (and
    # transformers' own fallback) loops over the experts with their row counts read back to
    # the host, which a CUDA graph cannot capture.
    host_read = moe and dtype != torch.bfloat16
    name = str(dtype).removeprefix("torch.")
    if config.cuda_graph == "on" and host_read:
        raise RuntimeError(
            f"fast_cuda_graph=on: a mixture-of-experts model in {name} reads its experts' row "
            "counts back to the host at every step, which a CUDA graph cannot capture; use "
            "bfloat16, or fast_cuda_graph=auto or off"
        )
    graphs = config.cuda_graph == "on" or (config.cuda_graph == "auto" and cuda and not host_read)
    if cuda and host_read and config.cuda_graph == "auto":
        log.warning(
            "decode graphs off: a mixture-of-experts model's grouped GEMM runs in bfloat16 only",
            extra={"dtype": name},
        )
    if graphs and not cuda:
        raise RuntimeError("fast_cuda_graph=on needs a CUDA device")
    compiled = config.compile == "on" or (config.compile == "auto" and cuda)
    attention = config.attention
    if attention == "auto":
        small = triton_runs(dtype, device, config.page_size)
        attention = ("triton" if small else "flex") if cuda else "gather"
    if graphs and attention == "gather":
        raise RuntimeError("the fast engine captures graphs with the flex or triton attention only")
    if attention == "flex" and not flex_in_graphs(graphs, compiled):
        if config.cuda_graph == "on":
            raise RuntimeError(
                "fast_cuda_graph=on with FlexAttention needs fast_compile: uncompiled it copies "
                "host values into every call, which a CUDA graph cannot capture"
            )
        graphs = False
        log.warning("decode graphs off: uncompiled FlexAttention cannot be captured")
    return rows, prefill, graphs, compiled, attention


# Where nothing else is set, prefill steps of up to a quarter of the chunk (a 16 or 24 GiB
# card's 2,048: 512), and never more than this, run as graphs: the largest bucket
# (``prefill.prefill_buckets``), whose activations stay held in the graphs' pool. A steady
# state's prefills (the prompts that arrived during one decode step) are well under it, and
# launched layer by layer from the host they outlast an FP8 decode step of 1,024 rows.
PREFILL_GRAPH_TOKENS = 2048


def prefill_graph_tokens_for(
    setting: int | None, graphs: bool, capturable: bool, chunk: int, cuda: bool = True
) -> int:
    """The largest prefill step run as a CUDA graph: as set, else a quarter of the prefill chunk
    (at most ``PREFILL_GRAPH_TOKENS``) where the decode steps are graphs and the prefill's
    attention is ``capturable`` (a varlen kernel, ``Capability.prefill_kernel``: attention split
    on the host cannot be captured); never more than the chunk. Set on a GPU without such a
    kernel, refused."""
    if setting and cuda and not capturable:
        raise RuntimeError(
            "fast_prefill_graph_tokens needs a varlen prefill kernel on a GPU (a 16-bit model; "
            "bfloat16 from compute capability 8.0): attention split on the host cannot be "
            "captured"
        )
    if setting is None:
        setting = min(PREFILL_GRAPH_TOKENS, chunk // 4) if graphs and capturable else 0
    return min(setting, chunk)


def kv_dtype_for(
    setting: str, dtype: torch.dtype, capability: Capability, attention: str
) -> torch.dtype:
    """What the KV cache stores: the model's ``dtype``, or with ``fp8`` 8-bit e4m3, which the
    Triton decode attention and the gathering one read (FlexAttention wants the queries' dtype),
    on CUDA from compute capability 8.9 (the conversions); refused elsewhere."""
    if setting != "fp8":
        return dtype
    if attention == "flex" or (capability.cuda and not capability.fp8):
        major, minor = capability.version
        where = f"compute capability {major}.{minor}" if capability.cuda else "a CPU"
        raise RuntimeError(
            "fast_kv_cache_dtype=fp8 needs the Triton decode attention (a 16-bit model on "
            "CUDA) or the gathering one, and on CUDA compute capability 8.9 (Ada, Hopper); "
            f"this engine has {where}, {str(dtype).removeprefix('torch.')} and {attention} "
            "attention"
        )
    return KV_FP8


def flex_in_graphs(graphs: bool, compiled: bool) -> bool:
    """Whether FlexAttention may take decode steps: compiled, or outside CUDA graphs. Uncompiled
    it is torch's reference loop, which makes tensors from host values at every call, and a
    graph's capture refuses such a copy (the Triton kernel then takes every batch)."""
    return compiled or not graphs


def fused_rope_for(setting: str, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the decode layers take the fused RoPE kernel: ``on`` wherever Triton is there
    (else the engine refuses to start), ``auto`` where it runs (``rope.runs``)."""
    if setting == "on" and not rope.built():
        raise RuntimeError("fast_fused_rope=on needs Triton (a CUDA build of torch)")
    return setting == "on" or (setting == "auto" and rope.runs(dtype, device))


def fold_norms_for(
    setting: str, loaded: LoadedModel, moe: bool, fp8: Fp8Checkpoint | None, one_row_pdl: bool
) -> bool:
    """Whether the norms fold into the projections after them (never into bitsandbytes
    weights): ``on`` wherever they can,
    ``auto`` where every one of them folds and a lone request's layers then launch with PDL
    (``one_row_pdl``: the step passes the norms' sums of squares between one-row projections,
    ``passes_norm_sums``), which needs a dense model (not ``moe``) of 16-bit weights on CUDA,
    not read from an FP8 checkpoint. Elsewhere the folded step measured slower than the norm
    kernels: where the reading kernel sums the squares itself (the 30B's experts), and where the
    compiled layer passes the sums (inductor copies the slices a kernel writes)."""
    if bitsandbytes(loaded):
        return False  # a norm's weight does not fold into quantized codes
    if setting != "auto":
        return setting == "on"
    return one_row_pdl and not moe and fp8 is None and gemv.runs(loaded.dtype, loaded.device)


def bitsandbytes(loaded: LoadedModel) -> bool:
    """Whether ``loaded``'s projections are bitsandbytes' (nf4, fp4 from a checkpoint saved so,
    or int8; the output layer too with ``+lm_head``)."""
    return loaded.quantization.split("+")[0] in ("nf4", "fp4", "int8")


def pdl_ready(
    setting: str, graphs: bool, capability: Capability, fused_rope: bool, attention: str
) -> bool:
    """Whether a lone request's layers can launch with PDL, but for the folded norms (which
    ``fold_norms_for`` then decides on): wanted, in CUDA graphs on a GPU of compute capability
    9.0+ (Hopper's grid dependency control), with a Triton that has it, and with the step's
    other kernels the engine's own (the fused RoPE, the Triton attention)."""
    return (
        setting != "off"
        and graphs
        and capability.pdl
        and fused_rope
        and attention == "triton"
        and launch.supported()
    )


def one_row_pdl_for(setting: str, possible: bool) -> bool:
    """Whether a lone request's layers launch with programmatic dependent launch: ``on`` where
    ``possible`` (else the engine refuses to start), ``auto`` where possible."""
    if setting == "on" and not possible:
        raise RuntimeError(
            "fast_pdl=on needs CUDA graphs on a GPU of compute capability 9.0+, Triton 3.4+, "
            "the fused RoPE (fast_fused_rope), every norm folded (fast_fold_norms auto or on, "
            "a dense model) and the triton attention"
        )
    return possible and setting != "off"


def prefill_warmups(bounds: tuple[int, ...], chunk: int, pages: int, page_size: int) -> list[int]:
    """The token counts the prefill is run with before ready (``_compile_prefill``): one, then
    two more (the count turns dynamic), and for each of ``bounds`` (bitsandbytes weights take
    another kernel past so many rows) a count in each branch that a chunk and the cache reach."""
    counts = [1, 16, 17]
    for bound in bounds:
        if 1 < bound < counts[-1] and bound not in counts:
            counts.append(bound)
        wide = bound + 1
        if wide > 17 and chunk >= wide and pages_for(wide, page_size) < pages:
            counts.append(wide)
    return sorted(counts)
