"""A projection's weights and how ``x @ weight.T`` is computed for each format the fast engine
holds: the model's own dtype, FP8 with a scale per output row (``torch._scaled_mm``), and
bitsandbytes' int8 rows and 4-bit codes (``bnb.py`` takes those over), dequantized where they are
multiplied: for a batch into the activations' dtype and then one GEMM; for one row, under
``torch.compile``, inside the reduction that reads them (``row_product``), so a lone request reads
the packed bytes only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
# bitsandbytes' int8 step (1 / 127), the float32 constant its dequantization multiplies by.
_INT8_STEP = 7.874015718698502e-3


@dataclass(frozen=True, slots=True)
class NestedMaxima:
    """4-bit block maxima as bitsandbytes' double quantization keeps them: ``Linear.scale`` holds
    an 8-bit code per maximum (``uint8 [out, in / block]``), which stands for ``code[q]`` times
    its group's ``absmax`` plus its group's ``offset``; a group is ``GROUP`` consecutive maxima
    in row-major order. A quarter of the float32 maxima's memory."""

    code: torch.Tensor  # float32 [256]
    absmax: torch.Tensor  # float32 [groups]
    offset: torch.Tensor  # float32 [groups]

    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in (self.code, self.absmax, self.offset))

    def maxima(self, quantized: torch.Tensor) -> torch.Tensor:
        """The float32 maxima the 8-bit codes ``quantized`` stand for, in their shape (what
        bitsandbytes computes at every call)."""
        groups = self.code[quantized.long()].view(-1, GROUP)
        return (groups * self.absmax[:, None] + self.offset[:, None]).view(quantized.shape)


# Consecutive block maxima that share one scale and offset (bitsandbytes' nested block size).
GROUP = 256


@dataclass(frozen=True, slots=True)
class LayerMaxima:
    """The nested block maxima of a layer's 4-bit projections side by side, dequantized all at
    once: ``quantized`` their 8-bit codes in the order a step multiplies the projections,
    ``nested`` their groups' scales and offsets in the same order, ``out`` the float32 maxima
    written there (one kernel a layer where there was one a projection, each a few
    microseconds of launch and tail for a lone request). ``out`` is as long as the largest
    layer's and shared by every layer of a model: one step's layers run one after another, on
    one stream."""

    quantized: torch.Tensor  # uint8 [maxima of the layer]
    nested: NestedMaxima
    out: torch.Tensor  # float32 [at least the maxima of the layer]


@dataclass(frozen=True, slots=True)
class MaximaSlice:
    """Where a projection's float32 block maxima lie in its layer's ``LayerMaxima.out``: from
    ``start``, ``count`` of them; the ``first`` projection a step multiplies writes the whole
    layer's, the others read theirs."""

    layer: LayerMaxima
    start: int
    count: int
    first: bool


@dataclass(frozen=True, slots=True)
class Linear:
    """A bias-free projection ``x @ weight.T``. ``scale`` set: ``weight`` is FP8 with one float32
    scale per output row (``[out, 1]``), int8 with each row's absolute maximum (``[out, 1]``,
    bitsandbytes' ``SCB``: a row is ``weight * scale / 127``), or with ``code`` bitsandbytes' 4-bit
    format:
    ``weight`` the codes packed two to a byte (``uint8 [out, in / 2]``, the first in the high
    half), ``scale`` the float32 absolute maximum of each block of inputs (``[out, in / block]``;
    8-bit codes of them with ``nested``) and ``code`` the 16 values a code stands for (NF4's, or
    FP4's)."""

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    code: torch.Tensor | None = None
    nested: NestedMaxima | None = None
    # With ``nested``: the maxima dequantized with the rest of its layer's (views of the same
    # codes and scales as ``scale`` and ``nested``, so not counted again in ``nbytes``).
    maxima: MaximaSlice | None = None
    # An FP8 weight's batch product in the tensor cores' fast accumulation (``fp8_linear``).
    fast_accum: bool = False
    # 4-bit codes whose batches of up to ``quant_gemv.WIDE_TILE_ROWS`` rows take
    # ``four_bit_matmul``'s wide tile: the device has the shared memory for it
    # (``Capability.wide_four_bit``).
    wide_tile: bool = False

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def bitsandbytes(self) -> bool:
        """Whether ``weight`` is int8 or 4-bit codes (dequantized where it is multiplied)."""
        return is_bitsandbytes(self.weight)

    def nbytes(self) -> int:
        parts = (self.weight, self.scale, self.code)
        nested = 0 if self.nested is None else self.nested.nbytes()
        return nested + sum(t.nelement() * t.element_size() for t in parts if t is not None)


def is_bitsandbytes(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is stored as bitsandbytes stores it: int8 rows, or 4-bit codes."""
    return weight.dtype in (torch.int8, torch.uint8)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    code: torch.Tensor | None = None,
    nested: NestedMaxima | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` for a plain, an FP8 or a bitsandbytes weight (written as a function so
    torch.compile sees plain tensors; ``fast_accum`` as ``fp8_linear`` takes it). A single
    16-bit row on CUDA never gets here (``projections.py`` gives it the one-row kernel); an FP8
    or bitsandbytes weight at a single row under ``torch.compile`` takes ``row_product``, which
    reads the weight in its own format."""
    if is_bitsandbytes(weight):
        assert scale is not None, "a bitsandbytes weight has its scales"
        dequantized = dequantize(weight, scale, code, x.dtype, nested)
        if x.shape[0] == 1 and torch.compiler.is_compiling():
            return row_product(x, dequantized, None)
        return torch.nn.functional.linear(x, dequantized)
    if scale is not None and x.shape[0] == 1 and torch.compiler.is_compiling():
        return row_product(x, weight, scale)
    if scale is None:
        return torch.nn.functional.linear(x, weight)
    return fp8_linear(x, weight, scale, fast_accum)


def dequantize(
    weight: torch.Tensor,
    scale: torch.Tensor,
    code: torch.Tensor | None,
    dtype: torch.dtype,
    nested: NestedMaxima | None = None,
) -> torch.Tensor:
    """A bitsandbytes weight as ``[out, in]`` values of ``dtype``, computed as bitsandbytes does
    (in float32, rounded once): int8 rows times their absolute maximum over 127; 4-bit codes
    looked up in ``code`` and times their block's absolute maximum."""
    if code is None:
        return (weight.float() * scale * _INT8_STEP).to(dtype)
    if nested is not None:
        scale = nested.maxima(scale)
    rows, half = weight.shape
    pairs = torch.stack((weight >> 4, weight & 15), dim=-1).view(rows, 2 * half)
    values = code[pairs.long()].view(rows, scale.shape[1], -1) * scale[:, :, None]
    return values.view(rows, 2 * half).to(dtype)


def row_product(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T`` for one row written as a multiply and a sum over the inputs (FP8 weights
    scaled per output row, the activations left unquantized). Compiled, it is one reduction
    kernel that reads the weights once in their own dtype, with the residual add after it and
    the norm before it fused in, where ``_scaled_mm`` pads the row to 16 for a tile made for
    many and quantizes the activations first. Eager it would materialise the whole product:
    only compiled code calls it."""
    product = (x[:, None, :].float() * weight[None].float()).sum(-1)
    if scale is not None:
        product = product * scale[:, 0]
    return product.to(x.dtype)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, fast_accum: bool = False
) -> torch.Tensor:
    """Row-wise FP8 GEMM: each token's activations get their own scale (``fast_accum``: the
    tensor cores' own accumulator throughout, never promoted to float32 along the way)."""
    rows = x.shape[0]
    # _scaled_mm wants the row count a multiple of 16; decode buckets usually are.
    padded = (-rows) % 16
    if padded:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded))
    x_fp8, x_scale = quantize_rows(x)
    return scaled_product(x_fp8, x_scale, weight, scale, x.dtype, rows, fast_accum)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x`` (``[rows, width]``) in e4m3 with its float32 scale ``[rows, 1]``: the
    row's absolute maximum over e4m3's largest value."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def scaled_product(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    rows: int,
    fast_accum: bool = False,
) -> torch.Tensor:
    """The first ``rows`` rows of the product of activations already cast to FP8 (rows padded to
    a multiple of 16, each with its scale) and an FP8 weight, in ``dtype``."""
    out = torch._scaled_mm(
        x_fp8,
        weight.t(),
        scale_a=x_scale,
        scale_b=scale.t(),
        out_dtype=dtype,
        use_fast_accum=fast_accum,
    )
    return out[:rows] if out.shape[0] != rows else out


def quantize_fp8(weight: torch.Tensor) -> Linear:
    """A row-wise FP8 copy of ``weight`` (``[out, in]``)."""
    quantized, scale = quantize_rows(weight)
    return Linear(quantized.contiguous(), scale.contiguous())
