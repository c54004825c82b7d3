"""The weights the fast engine runs: taken out of a loaded transformers model, fused, and
optionally stored as FP8.

Each layer's query, key and value projections become one matrix, and so do the gate and up
projections: one GEMM instead of three (two) per layer, with the same output columns. The
transformers modules are emptied layer by layer as their weights are moved, so loading never holds
two copies of the model.

Hy-MT2-30B-A3B's mixture-of-experts blocks keep their experts as the 3-D tensors transformers
holds (``MoeWeights``; ``moe.py`` runs them).

With ``fold_norms`` (16-bit weights) the RMSNorm before QKV, and the one before a dense MLP's
gate/up, lose their weights to the matrix after them: ``W @ (w * h) == (W * w) @ h``. The norm
left is a plain ``x * rsqrt(mean(x^2) + eps)``, a scalar per row, which the one-row kernel
computes in the same loop that reads the row for the projection, so a lone request's layer has no
norm kernels. The products are rounded once, in the weight's dtype (the float32 engine keeps the
model's weights as they are: its greedy output is compared with transformers' token for token).

FP8 (``quantization="fp8"``) stores each projection as ``float8_e4m3fn`` with one float32 scale
per output row (row-wise, as Tencent's FP8 checkpoints are); activations are quantized per token
when the projection runs and multiplied with ``torch._scaled_mm``. Embeddings, norms and the output
layer stay in the model's dtype.

bitsandbytes weights (``nf4``, ``int8``: transformers loads and quantizes them) are taken over as
they are (``bnb.py``) and stay in their format (``linear.py`` multiplies them).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from transformers import PreTrainedModel

from service.engine.fast import bnb
from service.engine.fast.linear import FP8, Linear, quantize_fp8
from service.engine.output_layer import PaddedOutputLayer

SUPPORTED_MODEL_TYPES = ("hunyuan_v1_dense", "hy_v3")


@dataclass(frozen=True, slots=True)
class MoeWeights:
    router: torch.Tensor  # float32 [experts, hidden]
    correction: torch.Tensor  # float32 [experts]: added to the scores only to choose
    gate_up: torch.Tensor  # [experts, 2 * intermediate, hidden]
    down: torch.Tensor  # [experts, hidden, intermediate]
    shared_gate_up: Linear
    shared_down: Linear
    top_k: int
    scaling: float
    fp32_combine: bool

    def nbytes(self) -> int:
        tensors = (self.router, self.correction, self.gate_up, self.down)
        dense = sum(t.nelement() * t.element_size() for t in tensors)
        return dense + self.shared_gate_up.nbytes() + self.shared_down.nbytes()


@dataclass(frozen=True, slots=True)
class LayerWeights:
    # None: the norm's weight is folded into the projection after it (``fold_norms``).
    input_norm: torch.Tensor | None
    qkv: Linear
    query_norm: torch.Tensor | None
    key_norm: torch.Tensor | None
    o: Linear
    post_norm: torch.Tensor | None
    # A dense MLP (gate/up fused, down), or a mixture of experts.
    gate_up: Linear | None
    down: Linear | None
    moe: MoeWeights | None = None


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shapes the forward pass needs."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    vocab: int
    max_positions: int
    # Hunyuan dense normalises queries and keys after RoPE, Hy-MT2-30B-A3B before.
    norm_before_rope: bool = False

    @property
    def scale(self) -> float:
        return float(self.head_dim**-0.5)


@dataclass(frozen=True, slots=True)
class ModelWeights:
    geometry: Geometry
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    # The output layer, rows possibly padded past the vocabulary (see output_layer.py).
    lm_head: Linear
    # RoPE tables for every position, in the model's dtype: [max_positions, head_dim], or
    # [max_positions, head_dim / 2] where a row's two halves are the same values (``rope``).
    cos: torch.Tensor
    sin: torch.Tensor

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[len(positions), head_dim]`` of ``positions``."""
        cos, sin = self.cos[positions], self.sin[positions]
        if cos.shape[-1] != self.geometry.head_dim:  # kept once for both halves
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        return cos, sin

    @property
    def fp8(self) -> bool:
        """Whether the layers' projections are FP8."""
        return self.layers[0].qkv.weight.dtype == FP8

    def nbytes(self) -> int:
        tensors = [self.embed, self.norm, self.cos, self.sin]
        total = sum(t.nelement() * t.element_size() for t in tensors)
        if self.lm_head.weight.data_ptr() != self.embed.data_ptr():
            total += self.lm_head.nbytes()
        for layer in self.layers:
            norms = [layer.input_norm, layer.post_norm, layer.query_norm, layer.key_norm]
            total += sum(t.nelement() * t.element_size() for t in norms if t is not None)
            projections = (layer.qkv, layer.o, layer.gate_up, layer.down)
            total += sum(p.nbytes() for p in projections if p is not None)
            total += 0 if layer.moe is None else layer.moe.nbytes()
        return total


class Fp8Source(Protocol):
    """Where FP8 projections come from (``checkpoint.Fp8Checkpoint``)."""

    def has(self, module_name: str) -> bool: ...

    def projection(self, module_names: list[str], device: torch.device) -> Linear: ...

    def experts(
        self, prefix: str, count: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor] | None: ...


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why the fast engine cannot run ``model``, or None."""
    model_type = str(getattr(model.config, "model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"the fast engine runs {', '.join(SUPPORTED_MODEL_TYPES)} models, not {model_type!r}"
    if getattr(model.config, "attention_bias", False):
        return "the fast engine runs bias-free attention projections only"
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "")
    name = str(getattr(method, "value", method))  # transformers' QuantizationMethod enum
    if quantizer is not None and name != "bitsandbytes":
        return f"the fast engine reads bitsandbytes or FP8 weights, not {name or 'these'}"
    return None


def is_dense(model: PreTrainedModel) -> bool:
    """Whether every layer of ``model`` has a dense MLP (no mixture-of-experts block)."""
    inner: Any = model.model  # typed as Tensor | Module by transformers
    return not any(hasattr(layer.mlp, "experts") for layer in inner.layers)


def take_weights(
    model: PreTrainedModel,
    quantization: str,
    fp8: Fp8Source | None = None,
    fold_norms: bool = False,
    fp8_fast_accum: bool = False,
    wide_four_bit: bool = False,
) -> ModelWeights:
    """Move ``model``'s weights into a ``ModelWeights``, emptying its layers on the way; the
    projections come from ``fp8`` (an FP8 checkpoint) where it has them. ``fold_norms`` folds
    each norm's weight into the projection after it where that projection is not a checkpoint's
    FP8 (a mixture-of-experts block keeps its norm: the router and experts read it);
    ``fp8_fast_accum`` marks FP8 projections for the fast accumulation (``linear.fp8_linear``),
    ``wide_four_bit`` 4-bit ones for ``four_bit_matmul``'s wide tile (``Linear.wide_tile``)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise RuntimeError(reason)
    config = model.config
    # transformers' submodules are typed as Tensor | Module: read them untyped.
    inner: Any = model.model
    geometry = geometry_of(config)
    embed = inner.embed_tokens.weight.data
    cos, sin = _rope_tables(inner, geometry, embed)
    projector = _Projector(quantization, fp8, fp8_fast_accum, wide_four_bit)
    layers = _share_layer_maxima(
        tuple(
            _layer_weights(layer, index, projector, config, fold_norms)
            for index, layer in enumerate(inner.layers)
        )
    )
    return ModelWeights(
        geometry=geometry,
        embed=embed,
        layers=layers,
        norm=inner.norm.weight.data,
        lm_head=_output_layer(model, wide_four_bit),
        cos=cos,
        sin=sin,
    )


def geometry_of(config: Any) -> Geometry:
    """The shapes the engine needs, from a transformers config."""
    return Geometry(
        hidden=int(config.hidden_size),
        heads=int(config.num_attention_heads),
        kv_heads=int(config.num_key_value_heads),
        head_dim=int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        ),
        intermediate=int(config.intermediate_size),
        eps=float(config.rms_norm_eps),
        vocab=int(config.vocab_size),
        max_positions=int(config.max_position_embeddings),
        norm_before_rope=config.model_type == "hy_v3",
    )


class _Projector:
    """Fused projections out of a layer's modules (emptied on the way): from the FP8
    checkpoint where it has them, else the model's weights, a norm folded in on request,
    quantized to FP8 when asked."""

    def __init__(
        self, quantization: str, fp8: Fp8Source | None, fast_accum: bool, wide: bool
    ) -> None:
        self.quantization = quantization
        self.fp8 = fp8
        self.fast_accum = fast_accum
        self.wide = wide

    def from_checkpoint(self, index: int, prefix: str, name: str) -> bool:
        return self.fp8 is not None and self.fp8.has(f"model.layers.{index}.{prefix}.{name}")

    def __call__(
        self,
        layer: nn.Module,
        index: int,
        prefix: str,
        *names: str,
        norm: torch.Tensor | None = None,
    ) -> Linear:
        owner = functools.reduce(getattr, prefix.split("."), layer)
        modules = [getattr(owner, name) for name in names]
        full_names = [f"model.layers.{index}.{prefix}.{name}" for name in names]
        if any(bnb.is_quantized(module) for module in modules):
            if norm is not None:
                raise RuntimeError("a norm does not fold into bitsandbytes weights")
            taken = _bitsandbytes(modules, self.wide)
            for module in modules:
                module.weight = nn.Parameter(taken.weight.new_empty(0), requires_grad=False)
            return taken
        weight = torch.cat([_weight_of(module) for module in modules])
        for module in modules:
            module.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
        if self.fp8 is not None and self.fp8.has(full_names[0]):
            taken = self.fp8.projection(full_names, weight.device)
            return dataclasses.replace(taken, fast_accum=self.fast_accum)
        if norm is not None:
            weight = (weight.float() * norm.float()).to(weight.dtype)
        if self.quantization == "fp8":
            return dataclasses.replace(quantize_fp8(weight), fast_accum=self.fast_accum)
        return Linear(weight.contiguous())


def _layer_weights(
    layer: Any, index: int, project: _Projector, config: Any, fold_norms: bool
) -> LayerWeights:
    """One decoder layer's weights (``fold_norms``: as ``take_weights`` says)."""
    attention = layer.self_attn
    query_norm = getattr(attention, "query_layernorm", None) or getattr(attention, "q_norm", None)
    key_norm = getattr(attention, "key_layernorm", None) or getattr(attention, "k_norm", None)
    moe = (
        _experts(layer, index, project, config, project.fp8)
        if hasattr(layer.mlp, "experts")
        else None
    )
    input_norm = layer.input_layernorm.weight.data
    post_norm = layer.post_attention_layernorm.weight.data
    fold_input = fold_norms and not project.from_checkpoint(index, "self_attn", "q_proj")
    fold_post = (
        fold_norms and moe is None and not project.from_checkpoint(index, "mlp", "gate_proj")
    )
    norm = input_norm if fold_input else None
    qkv = project(layer, index, "self_attn", "q_proj", "k_proj", "v_proj", norm=norm)
    gate_up = None
    if moe is None:
        norm = post_norm if fold_post else None
        gate_up = project(layer, index, "mlp", "gate_proj", "up_proj", norm=norm)
    return LayerWeights(
        input_norm=None if fold_input else input_norm,
        qkv=qkv,
        query_norm=None if query_norm is None else query_norm.weight.data,
        key_norm=None if key_norm is None else key_norm.weight.data,
        o=project(layer, index, "self_attn", "o_proj"),
        post_norm=None if fold_post else post_norm,
        gate_up=gate_up,
        down=None if moe else project(layer, index, "mlp", "down_proj"),
        moe=moe,
    )


def _share_layer_maxima(layers: tuple[LayerWeights, ...]) -> tuple[LayerWeights, ...]:
    """Dense layers whose four projections are 4-bit with nested maxima get them dequantized
    together, one kernel a layer (``linear.LayerMaxima``), into one buffer for all layers."""
    counts = [
        bnb.layer_maxima_count(_dense_projections(layer)) if layer.moe is None else None
        for layer in layers
    ]
    largest = max((count for count in counts if count is not None), default=0)
    if not largest:
        return layers
    out = torch.empty(largest, dtype=torch.float32, device=layers[0].qkv.weight.device)
    shared = []
    for layer, count in zip(layers, counts, strict=True):
        if count is None:
            shared.append(layer)
            continue
        qkv, o, gate_up, down = bnb.share_maxima(_dense_projections(layer), out)
        shared.append(dataclasses.replace(layer, qkv=qkv, o=o, gate_up=gate_up, down=down))
    return tuple(shared)


def _dense_projections(layer: LayerWeights) -> list[Linear]:
    """A dense layer's projections in the order a step multiplies them."""
    assert layer.gate_up is not None
    assert layer.down is not None
    return [layer.qkv, layer.o, layer.gate_up, layer.down]


def _experts(
    layer: Any, index: int, project: _Projector, config: Any, fp8: Fp8Source | None
) -> MoeWeights:
    """A mixture-of-experts block's weights; the routed experts run in the model's dtype (FP8
    covers the dense projections and the shared expert), an FP8 checkpoint's dequantized."""
    block = layer.mlp
    gate_up, down = block.experts.gate_up_proj.data, block.experts.down_proj.data
    read = None
    if fp8 is not None:
        prefix = f"model.layers.{index}.mlp.experts"
        read = fp8.experts(prefix, gate_up.shape[0], gate_up.dtype, gate_up.device)
    if read is not None:
        # What transformers loaded there is the FP8 values without their scales.
        gate_up, down = read
        for name in ("gate_up_proj", "down_proj"):
            setattr(block.experts, name, nn.Parameter(gate_up.new_empty(0), requires_grad=False))
    weights = MoeWeights(
        router=block.gate.weight.data.float(),
        correction=block.e_score_correction_bias.data.float(),
        gate_up=gate_up,
        down=down,
        shared_gate_up=project(layer, index, "mlp.shared_experts", "gate_proj", "up_proj"),
        shared_down=project(layer, index, "mlp.shared_experts", "down_proj"),
        top_k=int(block.top_k),
        scaling=float(block.gate.router_scaling_factor),
        fp32_combine=bool(getattr(config, "enable_moe_fp32_combine", False)),
    )
    return weights


def _weight_of(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight.data


def _output_layer(model: PreTrainedModel, wide_four_bit: bool) -> Linear:
    layer = model.get_output_embeddings()
    if isinstance(layer, PaddedOutputLayer):
        layer = layer.inner
    if not isinstance(layer, nn.Linear) or layer.bias is not None:
        raise RuntimeError("the fast engine needs a bias-free linear output layer")
    if bnb.is_quantized(layer):
        return _bitsandbytes([layer], wide_four_bit)
    return Linear(layer.weight.data)


def _bitsandbytes(modules: list[nn.Module], wide_four_bit: bool) -> Linear:
    """bitsandbytes' ``modules`` as one projection, 4-bit codes marked for the wide tile where
    ``wide_four_bit``."""
    taken = bnb.projection(modules)
    if wide_four_bit and taken.code is not None:
        return dataclasses.replace(taken, wide_tile=True)
    return taken


def _rope_tables(
    inner: nn.Module, geometry: Geometry, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position, computed by the model's own rotary module so they are
    the ones transformers uses."""
    positions = torch.arange(geometry.max_positions, device=like.device)[None]
    probe = like.new_zeros(1, 1, geometry.head_dim)
    cos, sin = inner.rotary_emb(probe, position_ids=positions)  # type: ignore[operator]
    cos, sin = cos[0], sin[0]
    half = geometry.head_dim // 2
    if torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:]):
        # RoPE turns each pair of dimensions (i, i + half) by one angle, so both halves of a
        # row hold the same values: kept once, half the tables' memory (``ModelWeights.rope``).
        cos, sin = cos[:, :half], sin[:, :half]
    return cos.contiguous(), sin.contiguous()
