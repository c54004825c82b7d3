"""Loading the model and tokenizer once, as the settings say.

Resolves device and dtype, builds the bitsandbytes configuration for ``nf4``/``int8``, loads the
tokenizer (fast only) and the weights, and reports each stage with the time and memory it took.
Runs on the engine's worker thread, never on the event loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from service.config import Settings
from service.engine.demo import DEMO_VERSION, ensure_demo_model

log = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    revision: str | None
    device: torch.device
    dtype: torch.dtype
    quantization: str
    load_seconds: float


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but no CUDA device is available")
    return torch.device(setting)


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting != "auto":
        return _DTYPES[setting]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # Half precision matmuls on CPU are slow or emulated; float32 is the fast path there.
    return torch.float32


def quantization_config(kind: str, dtype: torch.dtype) -> BitsAndBytesConfig | None:
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


def load_model(settings: Settings) -> LoadedModel:
    """Load tokenizer and model for ``settings``; builds the demo model first if none is set."""
    started = time.perf_counter()
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    source: str | Path
    if settings.model_id is None:
        source = ensure_demo_model(settings.data_dir)
        name, revision = f"hunyuan-mt-{DEMO_VERSION}", None
    else:
        source, name, revision = settings.model_id, settings.model_id, settings.model_revision
    log.info(
        "loading model",
        extra={
            "model": name,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "quantization": settings.quantization,
        },
    )

    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    if not tokenizer.is_fast:
        raise RuntimeError(f"{name}: no fast tokenizer available; only fast tokenizers are served")
    log.info("tokenizer loaded", extra={"seconds": round(time.perf_counter() - started, 3)})

    model = AutoModelForCausalLM.from_pretrained(
        source,
        revision=revision,
        dtype=dtype,
        quantization_config=quantization_config(settings.quantization, dtype),
        device_map={"": str(device)},
    )
    model.eval()
    seconds = time.perf_counter() - started
    log.info(
        "model loaded",
        extra={
            "seconds": round(seconds, 3),
            "weights_bytes": model.get_memory_footprint(),
            **cuda_memory(device),
        },
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        revision=revision,
        device=device,
        dtype=dtype,
        quantization=settings.quantization,
        load_seconds=seconds,
    )


def cuda_memory(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    return {
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device),
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device),
    }
