"""bitsandbytes quantization of the model's weights: the load-time config and the output layer.

transformers quantizes every linear layer while loading, except the output layer (``lm_head``),
which it keeps in full precision for output quality. Hunyuan-MT-7B's output layer is untied and
1 GB in bf16, so NF4 weights stay at 5.21 GiB unless it is quantized too. It is quantized here,
after loading, rather than by transformers (``llm_int8_skip_modules=[]``): its 128,167 rows are
an odd number, and bitsandbytes 0.50's kernels fail on that shape (on CUDA: "misaligned address"
under load; on CPU the 4-bit kernel asserts rows divisible by 32). The rows are padded with zeros
to a multiple of 128 and the extra logits sliced off, so callers see the vocabulary they expect.
"""

from __future__ import annotations

import bitsandbytes as bnb
import torch
from transformers import BitsAndBytesConfig, PreTrainedModel

from service.config import Settings

# Output rows are padded to a multiple of this before quantizing (see the module docstring).
_ROW_MULTIPLE = 128


def quantization_config(kind: str, dtype: torch.dtype) -> BitsAndBytesConfig | None:
    """The load-time bitsandbytes config for ``kind`` (``none`` gives ``None``)."""
    if kind == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
        )
    if kind == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def quantization_label(settings: Settings) -> str:
    """The quantization as reported and as part of the cache fingerprint."""
    if settings.quantization != "none" and settings.quantize_lm_head:
        return f"{settings.quantization}+lm_head"
    return settings.quantization


class PaddedOutputLayer(torch.nn.Module):
    """A quantized output layer whose rows were padded; returns logits for the real rows only."""

    def __init__(self, inner: torch.nn.Module, rows: int) -> None:
        super().__init__()
        self.inner = inner
        self.rows = rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner(hidden)
        return logits[..., : self.rows]


def quantize_output_layer(model: PreTrainedModel, kind: str, dtype: torch.dtype) -> None:
    """Replace ``model``'s full-precision output layer by a padded ``kind`` (nf4/int8) one."""
    layer = model.get_output_embeddings()
    if not isinstance(layer, torch.nn.Linear) or layer.bias is not None:
        raise RuntimeError("quantize_lm_head: the output layer is not a plain bias-free Linear")
    if model.config.tie_word_embeddings:
        raise RuntimeError("quantize_lm_head: the output layer is tied to the input embeddings")
    weight = layer.weight.data
    rows, columns = weight.shape
    padded = torch.cat([weight, weight.new_zeros((-rows) % _ROW_MULTIPLE, columns)]).cpu()
    quantized: torch.nn.Module
    if kind == "nf4":
        quantized = bnb.nn.Linear4bit(
            columns,
            padded.shape[0],
            bias=False,
            compute_dtype=dtype,
            quant_type="nf4",
            compress_statistics=True,
        )
        quantized.weight = bnb.nn.Params4bit(
            padded, requires_grad=False, quant_type="nf4", compress_statistics=True
        )
    elif kind == "int8":
        quantized = bnb.nn.Linear8bitLt(
            columns, padded.shape[0], bias=False, has_fp16_weights=False
        )
        quantized.weight = bnb.nn.Int8Params(padded, requires_grad=False, has_fp16_weights=False)
    else:
        raise ValueError(f"no output-layer quantization for {kind!r}")
    # Moving the parameters to their device is what quantizes them in bitsandbytes.
    model.set_output_embeddings(PaddedOutputLayer(quantized.to(weight.device), rows))
    del layer, weight
