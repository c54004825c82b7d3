"""The ``dummy`` load's checkpoint (``materialized_checkpoint``): built a module at a time, it
holds what ``random_model`` saved whole would hold, tensor by tensor alike in kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from service.engine.dummy import (
    dummy_config,
    materialized_checkpoint,
    random_model,
    random_model_on_host,
)

SPECIAL_IDS = {"bos": 1, "eos": 2, "pad": 0}
# The shipped architectures shrunk to a few small layers: a dense one with its output layer
# tied to the embedding, and the mixture of experts (a router's correction bias, experts'
# tensors of three dimensions, a shared expert).
SHRUNK: dict[str, dict[str, object]] = {
    "hy-mt1.5-1.8b": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
                      "vocab_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "head_dim": 16},
    "hy-mt2-30b-a3b": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
                       "vocab_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "head_dim": 16, "num_experts": 8, "moe_intermediate_size": 32,
                       "mlp_layer_types": ["dense", "sparse"]},
}  # fmt: skip


def _kind(tensor: torch.Tensor) -> tuple[str, float]:
    """What an initialisation made of ``tensor``: a constant (its value) or random numbers
    (their spread)."""
    values = tensor.float()
    if values.numel() > 1 and bool((values == values.flatten()[0]).all()):
        return "constant", round(values.flatten()[0].item(), 6)
    return "random", round(values.std().item(), 2)


def _shrunk(shipped: str) -> PretrainedConfig:
    config, _ = dummy_config(None, SPECIAL_IDS, shipped)
    for key, value in SHRUNK[shipped].items():
        setattr(config, key, value)
    return config


@pytest.mark.parametrize("shipped", sorted(SHRUNK))
def test_the_build_holds_one_modules_tensors_on_the_device_at_a_time(
    monkeypatch: pytest.MonkeyPatch, shipped: str
) -> None:
    # The host stands in as the meta device, so that what is on the CPU is what the device
    # holds: the 7B's whole 16-bit model (15 GiB) must never be there at once.
    config = _shrunk(shipped)
    model_class = type(random_model(config, torch.bfloat16, torch.device("cpu")))
    initialise = cast(Callable[[PreTrainedModel, nn.Module], None], model_class._init_weights)
    initialised: list[str] = []

    def checked(model: PreTrainedModel, module: nn.Module) -> None:
        own = {id(t) for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]}
        held = [t for t in [*model.parameters(), *model.buffers()] if t.device.type == "cpu"]
        assert held, type(module).__name__
        assert all(id(t) in own for t in held), type(module).__name__
        initialised.append(type(module).__name__)
        initialise(model, module)

    monkeypatch.setattr(model_class, "_init_weights", checked)
    model = random_model_on_host(
        config, torch.bfloat16, torch.device("cpu"), host=torch.device("meta")
    )
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    assert {"Embedding", "Linear"} <= set(initialised)


@pytest.mark.parametrize("shipped", sorted(SHRUNK))
def test_the_checkpoint_holds_the_random_models_weights_in_kind(
    tmp_path: Path, shipped: str
) -> None:
    config = _shrunk(shipped)
    folder = materialized_checkpoint(config, torch.bfloat16, torch.device("cpu"), tmp_path)
    saved = load_file(folder / "model.safetensors")
    random_model(config, torch.bfloat16, torch.device("cpu")).save_pretrained(tmp_path / "whole")
    expected = load_file(tmp_path / "whole" / "model.safetensors")
    assert set(saved) == set(expected)
    for name, tensor in saved.items():
        assert tensor.shape == expected[name].shape, name
        assert tensor.dtype == expected[name].dtype, name
        assert _kind(tensor) == _kind(expected[name]), name
