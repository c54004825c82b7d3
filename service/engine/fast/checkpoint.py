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
straight from the safetensors files (``Fp8Checkpoint.projection``), under the names the checkpoint
stores them by (transformers renames some on load: ``STORED_AS``). A mixture of experts' routed
experts (``experts.<e>.gate_proj``...) are read with their scales and dequantized to the model's
dtype (``Fp8Checkpoint.experts``): the grouped GEMM that runs them takes no FP8. Activations are
always quantized per token at run time. That covers the ``dynamic`` activation scheme; a
checkpoint's static ``input_scale`` is not used, which can only make the result more accurate.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from service.engine.fast.linear import FP8, Linear

METHOD = "compressed-tensors"
# Module names transformers gives a layer's parts -> the names Tencent's checkpoints store them
# under (the reverse of the renames transformers' conversion mapping applies for hy_v3).
STORED_AS = (("mlp.shared_experts.", "mlp.shared_mlp."),)


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

    def stored(self, module_name: str) -> str:
        """The name ``module_name``'s FP8 weight is stored under (itself where none matches)."""
        for model_name, checkpoint_name in STORED_AS:
            renamed = module_name.replace(model_name, checkpoint_name)
            if renamed != module_name and f"{renamed}.weight_scale" in self.files:
                return renamed
        return module_name

    def has(self, module_name: str) -> bool:
        return f"{self.stored(module_name)}.weight_scale" in self.files

    def projection(self, module_names: list[str], device: torch.device) -> Linear:
        """The FP8 weights of ``module_names`` stacked by rows, with one scale per row."""
        with _OpenFiles() as files:
            pairs = [self._fp8(self.stored(name), files) for name in module_names]
        return Linear(
            torch.cat([w for w, _ in pairs]).to(device).contiguous(),
            torch.cat([s for _, s in pairs]).to(device).contiguous(),
        )

    def experts(
        self, prefix: str, count: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The routed experts under ``prefix`` (``model.layers.<i>.mlp.experts``) dequantized to
        ``dtype``: gate and up stacked by rows ``[experts, 2 * I, hidden]`` and down
        ``[experts, hidden, I]``, the layout of transformers' fused expert tensors; None where
        the checkpoint has no FP8 experts there."""
        if f"{prefix}.0.gate_proj.weight_scale" not in self.files:
            return None
        gate_up, down = [], []
        with _OpenFiles() as files:
            for expert in range(count):
                parts = [
                    self._fp8(f"{prefix}.{expert}.{name}", files)
                    for name in ("gate_proj", "up_proj", "down_proj")
                ]
                restored = [(w.to(device).float() * s.to(device)).to(dtype) for w, s in parts]
                gate_up.append(torch.cat(restored[:2]))
                down.append(restored[2])
        return torch.stack(gate_up), torch.stack(down)

    def _fp8(self, name: str, files: _OpenFiles) -> tuple[torch.Tensor, torch.Tensor]:
        """``name``'s FP8 weight and its float32 scale, one per row ``[rows, 1]``."""
        weight = self._read(f"{name}.weight", files)
        if weight.dtype != FP8:
            raise ValueError(f"{name}.weight is {weight.dtype}, not {FP8}")
        scale = self._read(f"{name}.weight_scale", files).to(torch.float32).reshape(-1, 1)
        if scale.shape[0] == 1:  # one scale for the whole matrix: the same for every row
            scale = scale.expand(weight.shape[0], 1)
        if scale.shape[0] != weight.shape[0]:
            raise ValueError(f"{name}.weight_scale has {scale.shape[0]} rows, not 1 or rows")
        return weight, scale

    def _read(self, name: str, files: _OpenFiles) -> torch.Tensor:
        path = self.files.get(name)
        if path is None:
            raise KeyError(f"{self.folder}: no tensor {name}")
        return files.tensor(path, name)


class _OpenFiles:
    """safetensors files opened once each while a batch of tensors is read from them (a
    model's experts are thousands of tensors)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> _OpenFiles:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stack.close()

    def tensor(self, path: Path, name: str) -> torch.Tensor:
        handle = self._handles.get(path)
        if handle is None:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
            self._handles[path] = handle
        tensor: torch.Tensor = handle.get_tensor(name)
        return tensor
