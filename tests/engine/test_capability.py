"""The device's abilities, decided in one place from its compute capability: what a T4 (7.5),
an A10 or RTX 3090 (8.6), an RTX 4090 (8.9) and an H100/H200 (9.0) each get, checked with a faked
capability (no such GPU is here)."""

from __future__ import annotations

import pytest
import torch

from service.engine.capability import Capability, parse_version
from service.engine.loading import resolve_dtype

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("version", "bfloat16", "prefill", "fp8", "pdl", "auto"),
    [
        ((7, 5), False, "efficient", False, False, torch.float16),
        ((8, 0), True, "flash", False, False, torch.bfloat16),
        ((8, 6), True, "flash", False, False, torch.bfloat16),
        ((8, 9), True, "flash", True, False, torch.bfloat16),
        ((9, 0), True, "flash", True, True, torch.bfloat16),
    ],
    ids=["t4", "a100", "a10-3090", "4090", "h100-h200"],
)
def test_each_generation_gets_its_kernels(
    version: tuple[int, int],
    bfloat16: bool,
    prefill: str,
    fp8: bool,
    pdl: bool,
    auto: torch.dtype,
) -> None:
    gpu = Capability(True, version)
    assert gpu.bfloat16 is bfloat16
    # A varlen kernel on every generation (one launch a layer, captured in graphs): flash from
    # 8.0, the memory-efficient one on a T4; float32 (fidelity) stays on the reference.
    assert gpu.prefill_kernel(torch.float16) == prefill
    assert gpu.prefill_kernel(gpu.auto_dtype()) == prefill
    assert gpu.prefill_kernel(torch.float32) == "sdpa"
    assert gpu.fp8 is fp8
    assert gpu.pdl is pdl
    # The wide 4-bit tile's shared memory (93,184 bytes on 8.x, 131,072 on 7.5): from 8.0 on,
    # as bfloat16.
    assert gpu.wide_four_bit is bfloat16
    assert gpu.auto_dtype() == auto
    assert resolve_dtype("auto", gpu) == auto
    assert resolve_dtype("float16", gpu) == torch.float16
    if not bfloat16:
        with pytest.raises(RuntimeError, match=r"bfloat16 needs compute capability 8\.0"):
            resolve_dtype("bfloat16", gpu)
    if not fp8:
        with pytest.raises(RuntimeError, match=r"fp8 needs compute capability 8\.9"):
            gpu.check_quantization("fp8")
    gpu.check_quantization("nf4")


def test_a_cpu_takes_float32_and_the_reference_kernels() -> None:
    cpu = Capability.of(torch.device("cpu"))
    assert not cpu.cuda
    assert cpu.auto_dtype() == torch.float32
    assert cpu.prefill_kernel(torch.bfloat16) == "sdpa"
    assert cpu.prefill_kernel(torch.float16) == "sdpa"
    assert not cpu.wide_four_bit
    cpu.check_quantization("fp8")  # emulated on a CPU: allowed


def test_an_older_capability_can_be_forced_and_a_newer_one_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert Capability.of(CUDA).version == (9, 0)
    forced = Capability.of(CUDA, "7.5")
    assert forced.version == (7, 5)
    assert forced.auto_dtype() == torch.float16
    assert forced.prefill_kernel(torch.float16) == "efficient"
    # No bfloat16 below 8.0, nor a kernel for it there: a bfloat16 model forced old takes SDPA.
    assert forced.prefill_kernel(torch.bfloat16) == "sdpa"
    with pytest.raises(RuntimeError, match="only an older capability"):
        Capability.of(CUDA, "10.0")


def test_versions_are_read_as_written() -> None:
    assert parse_version("8.9") == (8, 9)
    assert parse_version("9") == (9, 0)
    with pytest.raises(ValueError, match=r"like 7\.5"):
        parse_version("ampere")
