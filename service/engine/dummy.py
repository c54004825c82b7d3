"""The ``dummy`` load format: a model built from its config with seeded random weights.

As vLLM's ``--load-format dummy``: no checkpoint is read, so the exact geometry of a model
(Hunyuan-MT-7B's config ships in ``configs/``) can be benchmarked where its weights cannot be
downloaded. The demo model's tokenizer stands in for the real one; its special-token ids replace
the config's so EOS and padding agree. Random weights almost never emit EOS, so every text runs to
its token budget and a benchmark's work is known.

Unquantized, the model is initialised directly on the device. bitsandbytes quantizes while it
loads a checkpoint, so for ``nf4``/``int8`` the random model is first written once to
``data_dir`` (safetensors) and then loaded from there like any real checkpoint. That model is
built one module at a time on the device, each moved to the host as soon as it is initialised:
the whole 16-bit model on the device would need more memory than the quantized service it stands
in for (a 16 GiB card cannot hold the 7B's 15 GiB of 16-bit weights and anything else), and the
start's peak would say what the build took instead of what the load takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from importlib import resources
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from service.engine.folders import build_once

log = logging.getLogger(__name__)

SEED = 0
HOST = torch.device("cpu")


def dummy_config(
    model_id: str | None, special_ids: dict[str, int], shipped: str = "hunyuan-mt-7b"
) -> tuple[PretrainedConfig, str]:
    """The config to build (the shipped config ``shipped`` when ``model_id`` is None) and its
    name."""
    if model_id is None:
        text = resources.files("service.engine").joinpath(f"configs/{shipped}.json")
        values = json.loads(text.read_text("utf-8"))
        values.pop("architectures", None)
        model_type = values.pop("model_type")
        config = AutoConfig.for_model(model_type, **values)
        name = f"{shipped}-dummy"
    else:
        config = AutoConfig.from_pretrained(model_id)
        name = f"{model_id}-dummy"
    config.bos_token_id = special_ids["bos"]
    config.eos_token_id = special_ids["eos"]
    config.pad_token_id = special_ids["pad"]
    return config, name


def random_model(
    config: PretrainedConfig, dtype: torch.dtype, device: torch.device
) -> PreTrainedModel:
    """Seeded random weights, initialised where they will run."""
    torch.manual_seed(SEED)
    with torch.device(device):
        model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def materialized_checkpoint(
    config: PretrainedConfig, dtype: torch.dtype, device: torch.device, data_dir: Path
) -> Path:
    """A folder holding the random model as a checkpoint, written once per config and dtype."""
    digest = hashlib.sha256(
        (config.to_json_string(use_diff=False) + str(dtype) + str(SEED)).encode()
    ).hexdigest()[:16]
    target = data_dir / f"dummy-{digest}"
    if (target / "config.json").is_file():
        return target
    started = time.perf_counter()

    def build(folder: Path) -> None:
        model = random_model_on_host(config, dtype, device)
        model.save_pretrained(folder)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    build_once(target, build)
    log.info(
        "dummy checkpoint written",
        extra={"path": str(target), "seconds": round(time.perf_counter() - started, 3)},
    )
    return target


def random_model_on_host(
    config: PretrainedConfig,
    dtype: torch.dtype,
    device: torch.device,
    host: torch.device = HOST,
) -> PreTrainedModel:
    """``random_model``'s weights, alike in kind (each initialised as transformers initialises
    its module), held by the host: the model is laid out without memory, then each module with
    tensors of its own gets them on ``device`` (where random numbers are quick), initialised,
    and moved to the host before the next, so the device holds one module at a time."""
    with torch.device("meta"):
        model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)
    torch.manual_seed(SEED)
    for module in model.modules():
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if not own:
            continue
        module.to_empty(device=device, recurse=False)
        model._init_weights(module)
        module._apply(lambda tensor: tensor.to(host), recurse=False)
    model.tie_weights()  # a tied output layer got tensors of its own above
    return model
