"""The step loop never makes the host wait for the device while it copies host values in.

torch's default copy to a GPU synchronizes the stream: a prefill whose inputs were copied that
way was launched only after the decode step in flight had finished, and the device then idled
while the host launched the prefill layer by layer. On a CPU nothing waits, so the test records
what the engine thread asks for instead: every copy that names a device must be non-blocking, and
no tensor is built directly on a device from host values (``torch.tensor(..., device=...)``
copies and waits), and a prefill reads nothing back but its first tokens."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from service.config.settings import Settings
from service.contract.types import GenerationRequest
from service.engine.fast.engine import FastEngine
from service.engine.fast.transfer import to_device
from service.engine.loading import load_model
from tests.engine.test_engine import SAMPLED, generate


def _on_engine_thread() -> bool:
    return threading.current_thread().name == "fast-engine"


def test_the_step_loop_copies_to_the_device_without_waiting(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four rows and prompts longer than a chunk: requests wait, are prefilled in chunks, join,
    # take pages and leave, so every kind of copy the loop makes happens.
    config = Settings(
        _env_file=None,
        data_dir=data_dir,
        fast_max_rows=4,
        fast_num_pages=96,
        fast_page_size=16,
        fast_prefill_tokens=24,
        max_new_tokens=20,
    ).engine_config()
    engine = FastEngine(load_model(config), config)
    blocking: list[str] = []
    reads: list[int] = []
    to, tensor, tolist = torch.Tensor.to, torch.tensor, torch.Tensor.tolist

    def recording_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        names_device = "device" in kwargs or any(isinstance(a, torch.device | str) for a in args)
        if names_device and _on_engine_thread() and not kwargs.get("non_blocking", False):
            blocking.append(f"Tensor.to{args}")
        return to(self, *args, **kwargs)

    def recording_tensor(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs and _on_engine_thread():
            blocking.append(f"torch.tensor(device={kwargs['device']})")
        return tensor(*args, **kwargs)

    def recording_tolist(self: torch.Tensor) -> Any:
        if _on_engine_thread():
            reads.append(self.numel())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    monkeypatch.setattr(torch.Tensor, "tolist", recording_tolist)
    monkeypatch.setattr(torch, "tensor", recording_tensor)
    try:
        prompts = [tuple(range(5, 5 + n)) for n in (3, 30, 7, 50, 12, 9)]
        results = generate(engine, [GenerationRequest(p, 20, SAMPLED) for p in prompts])
        prefills = engine.step_times().prefills
    finally:
        monkeypatch.undo()
        engine.close()
    assert len(results) == len(prompts)
    assert blocking == []
    # The one read back of a prefill is its first tokens (the prefill's attention splits its
    # sequences where the host packed them, not by reading their bounds back at every layer).
    assert 0 < len(reads) <= prefills


def test_a_copy_to_a_gpu_goes_through_page_locked_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA may synchronize a stream to stage a copy from pageable memory, non_blocking or not:
    # the values are pinned first. Recorded here, with no GPU: the calls the copy makes.
    calls: list[str] = []

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        calls.append("pin")
        return self

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(f"to {args[0]} non_blocking={kwargs.get('non_blocking')}")
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    to_device([1, 2, 3], torch.long, torch.device("cuda"))
    assert calls == ["pin", "to cuda non_blocking=True"]
    calls.clear()
    to_device([1, 2, 3], torch.long, torch.device("cpu"))
    assert calls == ["to cpu non_blocking=True"]  # nothing to pin for a CPU
