"""FP8 checkpoints in the compressed-tensors format (Tencent's ``-fp8`` / ``-FP8`` builds).

Such a checkpoint stores every projection of the decoder as ``<name>.weight`` in
``float8_e4m3fn`` with ``<name>.weight_scale`` beside it: one float32 scale per output row
(``strategy: channel``) or one for the whole matrix (``strategy: tensor``). Its ``config.json``
names the method in ``quantization_config.quant_method``; the layers left in full precision are
listed under ``ignore`` (Tencent's README says to rename their ``ignored_layers`` to that for
transformers; both names are read).

transformers would need the ``compressed-tensors`` package to load it. Instead the model is built
from the config without its quantization section, so the skeleton, the embeddings, the norms and
the output layer load as usual. The fast engine then reads the projections' FP8 weights and scales
straight from the safetensors files (``Fp8Checkpoint.projection``). Activations are always
quantized per token at run time. That covers the ``dynamic`` activation scheme; a checkpoint's
static ``input_scale`` is not used, which can only make the result more accurate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from service.engine.fast.weights import FP8, Linear

METHOD = "compressed-tensors"


def quantization_section(folder: Path) -> dict[str, Any] | None:
    """The checkpoint's compressed-tensors quantization config, or None for any other."""
    config = json.loads((folder / "config.json").read_text("utf-8"))
    section = config.get("quantization_config")
    if isinstance(section, dict) and section.get("quant_method") == METHOD:
        return section
    return None


@dataclass(frozen=True, slots=True)
class Fp8Checkpoint:
    """Where each FP8 projection's weight and scale are stored."""

    folder: Path
    # tensor name -> the safetensors file holding it
    files: dict[str, Path]

    @classmethod
    def open(cls, folder: Path) -> Fp8Checkpoint:
        section = quantization_section(folder)
        if section is None:
            raise ValueError(f"{folder}: not a compressed-tensors checkpoint")
        groups = section.get("config_groups") or {}
        for group in groups.values():
            weights = (group or {}).get("weights") or {}
            if weights and (weights.get("type"), weights.get("num_bits")) != ("float", 8):
                raise ValueError(
                    f"{folder}: only FP8 (float, 8 bits) compressed-tensors weights are read, "
                    f"not {weights.get('type')} {weights.get('num_bits')}-bit"
                )
            if weights.get("strategy") not in (None, "channel", "tensor"):
                raise ValueError(
                    f"{folder}: weight strategy {weights.get('strategy')!r} is not read "
                    "(channel and tensor are)"
                )
        files: dict[str, Path] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    files[name] = path
        return cls(folder, files)

    def has(self, module_name: str) -> bool:
        return f"{module_name}.weight_scale" in self.files

    def projection(self, module_names: list[str], device: torch.device) -> Linear:
        """The FP8 weights of ``module_names`` stacked by rows, with one scale per row."""
        weights, scales = [], []
        for name in module_names:
            weight = self._read(f"{name}.weight")
            if weight.dtype != FP8:
                raise ValueError(f"{name}.weight is {weight.dtype}, not {FP8}")
            scale = self._read(f"{name}.weight_scale").to(torch.float32).reshape(-1, 1)
            if scale.shape[0] == 1:  # one scale for the whole matrix: the same for every row
                scale = scale.expand(weight.shape[0], 1)
            if scale.shape[0] != weight.shape[0]:
                raise ValueError(f"{name}.weight_scale has {scale.shape[0]} rows, not 1 or rows")
            weights.append(weight)
            scales.append(scale)
        return Linear(
            torch.cat(weights).to(device).contiguous(), torch.cat(scales).to(device).contiguous()
        )

    def _read(self, name: str) -> torch.Tensor:
        path = self.files.get(name)
        if path is None:
            raise KeyError(f"{self.folder}: no tensor {name}")
        with safe_open(str(path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
        return tensor
