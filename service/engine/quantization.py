"""bitsandbytes quantization at load time: the config transformers applies, and its label.

transformers quantizes every linear layer while loading except the output layer (``lm_head``),
which it keeps in full precision for output quality; ``output_layer`` quantizes that one on
request (``quantize_lm_head``).
"""

from __future__ import annotations

import torch
from transformers import BitsAndBytesConfig


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


def quantization_label(kind: str, lm_head: bool) -> str:
    """``nf4``, ``nf4+lm_head`` (the output layer quantized too), ``int8``..., or ``none``."""
    if kind != "none" and lm_head:
        return f"{kind}+lm_head"
    return kind
