"""Loading the model and tokenizer once, as the settings say.

Resolves device and dtype, takes the bitsandbytes configuration from ``quantization``, loads the
tokenizer (fast only) and the weights, and reports each stage with the time and memory it took.
Runs on the engine's worker thread, never on the event loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from service.config.engine import EngineConfig
from service.contract.types import EngineInfo
from service.engine.capability import Capability
from service.engine.demo import demo_name, ensure_demo_model
from service.engine.dummy import dummy_config, materialized_checkpoint, random_model
from service.engine.output_layer import prepare_output_layer
from service.engine.quantization import quantization_config, quantization_label

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
    # Whether prompts end with the chat template's generation prompt (the family's way).
    add_generation_prompt: bool = False
    # A compressed-tensors FP8 checkpoint's folder: the model's projections were loaded cast
    # from FP8 without their scales, and only the fast engine (which reads them from here) runs.
    fp8_checkpoint: Path | None = None


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but no CUDA device is available")
    return torch.device(setting)


def resolve_dtype(setting: str, capability: Capability) -> torch.dtype:
    """The weights' dtype: as set, or ``capability``'s choice for ``auto``; bfloat16 on a GPU
    without it is refused (it would run emulated, or not at all)."""
    if setting == "auto":
        return capability.auto_dtype()
    dtype = _DTYPES[setting]
    if dtype == torch.bfloat16 and not capability.bfloat16:
        major, minor = capability.version
        raise RuntimeError(
            f"dtype=bfloat16 needs compute capability 8.0; this GPU has {major}.{minor}: "
            "use float16 (or auto)"
        )
    return dtype


def _device_and_dtype(settings: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """The device and the weights' dtype, what its capability allows, and its memory budget."""
    device = resolve_device(settings.model.device)
    capability = Capability.of(device, settings.fast.capability)
    dtype = resolve_dtype(settings.model.dtype, capability)
    capability.check_quantization(settings.model.quantization)
    if settings.fast.memory_gib is not None and device.type == "cuda":
        # The allocator refuses what would pass the budget (context memory aside).
        total = torch.cuda.get_device_properties(device).total_memory
        share = min(1.0, settings.fast.memory_gib * 2**30 / total)
        # (It takes a device with an index: "cuda" alone is refused.)
        index = torch.cuda.current_device() if device.index is None else device.index
        torch.cuda.set_per_process_memory_fraction(share, index)
    return device, dtype


def load_model(settings: EngineConfig) -> LoadedModel:
    """Load tokenizer and model as ``settings`` say; builds the demo model first if none is set."""
    started = time.perf_counter()
    device, dtype = _device_and_dtype(settings)
    quantization = quantization_config(settings.model.quantization, dtype)
    label = quantization_label(settings.model.quantization, settings.model.quantize_lm_head)
    revision = settings.model.model_revision
    if settings.model.load_format == "dummy" or settings.model.model_id is None:
        tokenizer_source: str | Path = ensure_demo_model(
            settings.model.data_dir, settings.chat_format
        )
        tokenizer_revision = None
    else:
        tokenizer_source, tokenizer_revision = settings.model.model_id, revision
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, revision=tokenizer_revision)
    if not tokenizer.is_fast:
        raise RuntimeError(
            f"{tokenizer_source}: no fast tokenizer; only fast tokenizers are served"
        )

    model: PreTrainedModel
    fp8_checkpoint: Path | None = None
    if settings.model.load_format == "dummy":
        config, name = dummy_config(
            settings.model.model_id, _special_ids(tokenizer), settings.shipped_config
        )
        revision = None
        _log_loading(name, device, dtype, label)
        if quantization is None:
            model = random_model(config, dtype, device)
        else:
            checkpoint = materialized_checkpoint(config, dtype, device, settings.model.data_dir)
            model = _from_pretrained(checkpoint, None, dtype, quantization, device)
    else:
        source: str | Path
        if settings.model.model_id is None:
            source, name, revision = tokenizer_source, demo_name(settings.shipped_config), None
        else:
            source, name = settings.model.model_id, settings.model.model_id
        config = AutoConfig.from_pretrained(source, revision=revision)
        saved = _saved_format(config, settings, name, (source, revision))
        label, fp8_checkpoint = saved.label or label, saved.fp8_checkpoint
        if saved.quantized:
            quantization = None  # transformers reads the codes as they were saved
        _log_loading(name, device, dtype, label)
        model = _from_pretrained(source, revision, dtype, quantization, device, config)
    model.eval()
    # The output layer stays in the model's dtype unless quantize_lm_head asks otherwise.
    head = settings.model.quantization if settings.model.quantize_lm_head else "none"
    prepare_output_layer(model, head, dtype)
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
        quantization=label,
        load_seconds=seconds,
        add_generation_prompt=settings.add_generation_prompt,
        fp8_checkpoint=fp8_checkpoint,
    )


@dataclass(frozen=True, slots=True)
class _SavedFormat:
    """What a checkpoint says of its own weights: their format's label where it names one, the
    folder of an FP8 checkpoint the fast engine reads itself, whether bitsandbytes saved it
    quantized (then it is not quantized again)."""

    label: str | None = None
    fp8_checkpoint: Path | None = None
    quantized: bool = False


def _saved_format(
    config: PretrainedConfig,
    settings: EngineConfig,
    name: str,
    where: tuple[str | Path, str | None],
) -> _SavedFormat:
    if _is_compressed_fp8(config):
        # Its projections are read by the fast engine itself (fast/checkpoint.py).
        if settings.model.quantization in ("nf4", "int8"):
            raise RuntimeError(
                f"{name} is an FP8 (compressed-tensors) checkpoint, which bitsandbytes does "
                "not quantize again: leave HYMT_QUANTIZATION unset for it"
            )
        del config.quantization_config
        return _SavedFormat("fp8", _local_folder(*where))
    saved = saved_bitsandbytes(config)
    if saved is None:
        return _SavedFormat()
    head = settings.model.quantize_lm_head and settings.model.quantization != "none"
    return _SavedFormat(quantization_label(saved, head), quantized=True)


def saved_bitsandbytes(config: PretrainedConfig) -> str | None:
    """``nf4``, ``fp4`` or ``int8`` where the checkpoint was saved quantized by bitsandbytes."""
    section = getattr(config, "quantization_config", None)
    if section is not None and not isinstance(section, dict):
        section = section.to_dict()
    if not section or str(section.get("quant_method")) != "bitsandbytes":
        return None
    if section.get("load_in_4bit"):
        return str(section.get("bnb_4bit_quant_type") or "nf4")
    return "int8" if section.get("load_in_8bit") else None


def _is_compressed_fp8(config: PretrainedConfig) -> bool:
    section = getattr(config, "quantization_config", None)
    method = section.get("quant_method") if isinstance(section, dict) else None
    return method == "compressed-tensors"


def _local_folder(source: str | Path, revision: str | None) -> Path:
    """The checkpoint's folder on this machine (the Hub's cache for a model id)."""
    if Path(source).is_dir():
        return Path(source)
    return Path(
        snapshot_download(
            str(source), revision=revision, allow_patterns=["*.json", "*.safetensors"]
        )
    )


def _from_pretrained(
    source: str | Path,
    revision: str | None,
    dtype: torch.dtype,
    quantization: BitsAndBytesConfig | None,
    device: torch.device,
    config: PretrainedConfig | None = None,
) -> PreTrainedModel:
    extra = {} if config is None else {"config": config}
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        source,
        revision=revision,
        **extra,
        dtype=dtype,
        quantization_config=quantization,
        device_map={"": str(device)},
    )
    return model


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    ids = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
    }
    missing = [name for name, value in ids.items() if not isinstance(value, int)]
    if missing:
        raise RuntimeError(f"the tokenizer defines no {', '.join(missing)} token")
    return {name: int(value) for name, value in ids.items() if value is not None}


def _log_loading(name: str, device: torch.device, dtype: torch.dtype, quantization: str) -> None:
    log.info(
        "loading model",
        extra={
            "model": name,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "quantization": quantization,
        },
    )


def engine_info(loaded: LoadedModel) -> EngineInfo:
    return EngineInfo(
        model=loaded.name,
        revision=loaded.revision,
        dtype=str(loaded.dtype).removeprefix("torch."),
        quantization=loaded.quantization,
        device=str(loaded.device),
        load_seconds=loaded.load_seconds,
        weights_bytes=int(loaded.model.get_memory_footprint()),
        attention=str(loaded.model.config._attn_implementation),
    )


def memory_by_kind(device: torch.device) -> dict[str, int]:
    """Accelerator memory by kind (allocated, reserved, and the most of each since start), for
    the GPU memory gauge: the peaks say how much of an operator's budget the widest step really
    took beside the weights and the cache."""
    memory = {
        key.removeprefix("cuda_").removesuffix("_bytes"): value
        for key, value in cuda_memory(device).items()
    }
    if memory:
        memory["peak_allocated"] = torch.cuda.max_memory_allocated(device)
        memory["peak_reserved"] = torch.cuda.max_memory_reserved(device)
    return memory


def cuda_memory(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    return {
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device),
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device),
    }
