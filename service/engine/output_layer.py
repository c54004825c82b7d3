"""The output layer (``lm_head``): padded to aligned rows, and quantized on request.

Hunyuan-MT-7B's vocabulary has 128,167 entries, an odd number of output rows. In bf16 that makes
every logits row misaligned for vectorised stores, and cuBLAS falls back to an ``align1`` GEMM
kernel, a visible share of a lone request's GPU time (``loadtests.profile``). bitsandbytes
0.50's kernels fail on the shape outright (NF4 on CUDA: "misaligned address" under load; on CPU
the 4-bit kernel asserts rows divisible by 32). So the
untied output layer is rebuilt with its rows padded with zeros to a multiple of 128, and the
extra logits are sliced off: callers see exactly the vocabulary they expect, and the padded
tokens can never be chosen. Tied output layers (one matrix with the input embeddings) are left
as they are, since padding would untie them and add a copy of the matrix.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

_ROW_MULTIPLE = 128


class PaddedOutputLayer(torch.nn.Module):
    """An output layer with padded rows that returns the logits of the real rows only."""

    def __init__(self, inner: torch.nn.Module, rows: int) -> None:
        super().__init__()
        self.inner = inner
        self.rows = rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner(hidden)
        return logits[..., : self.rows]


def prepare_output_layer(model: PreTrainedModel, quantization: str, dtype: torch.dtype) -> bool:
    """Pad ``model``'s untied output layer and quantize it as ``quantization`` (nf4, int8 or none).

    Returns whether the layer was replaced.
    """
    layer = model.get_output_embeddings()
    if model.config.tie_word_embeddings:
        if quantization != "none":
            raise RuntimeError("quantize_lm_head: the output layer is tied to the input embeddings")
        return False
    if not isinstance(layer, torch.nn.Linear) or layer.bias is not None:
        # Padding only speeds things up; quantizing was asked for and cannot be done here.
        if quantization != "none":
            raise RuntimeError("quantize_lm_head: the output layer is not a bias-free Linear")
        return False
    weight = layer.weight.data
    rows, columns = weight.shape
    if rows % _ROW_MULTIPLE == 0 and quantization == "none":
        return False
    padded = torch.cat([weight, weight.new_zeros((-rows) % _ROW_MULTIPLE, columns)])
    inner: torch.nn.Module
    if quantization == "none":
        inner = torch.nn.Linear(columns, padded.shape[0], bias=False, dtype=dtype, device="meta")
        inner.weight = torch.nn.Parameter(padded, requires_grad=False)
    elif quantization == "nf4":
        # Imported only for quantized weights: bitsandbytes logs warnings about its own
        # kernels when imported, which a service without quantization should not print.
        import bitsandbytes as bnb

        inner = bnb.nn.Linear4bit(
            columns,
            padded.shape[0],
            bias=False,
            compute_dtype=dtype,
            quant_type="nf4",
            compress_statistics=True,
        )
        inner.weight = bnb.nn.Params4bit(
            padded.cpu(), requires_grad=False, quant_type="nf4", compress_statistics=True
        )
    elif quantization == "int8":
        import bitsandbytes as bnb

        inner = bnb.nn.Linear8bitLt(columns, padded.shape[0], bias=False, has_fp16_weights=False)
        inner.weight = bnb.nn.Int8Params(padded.cpu(), requires_grad=False, has_fp16_weights=False)
    else:
        raise ValueError(f"no output-layer quantization {quantization!r}")
    # For bitsandbytes, moving the parameters to their device is what quantizes them.
    model.set_output_embeddings(PaddedOutputLayer(inner.to(weight.device), rows))
    return True
