"""What the device can run, decided in one place from its CUDA compute capability.

The choices that depend on the GPU's generation: bfloat16 (8.0+: Ampere; a T4 is 7.5), torch's
FlashAttention-2 varlen kernel for prefill (8.0+, half precision; its memory-efficient varlen
kernel below, SDPA off CUDA or in float32), FP8 weights
(8.9+: the ``_scaled_mm`` kernels of Ada and Hopper), the wide tile of 4-bit batches (8.0+: its
shared memory), programmatic dependent launch (9.0+).
``HYMT_FAST_CAPABILITY`` makes the engine choose as if the GPU were an older one (never a newer
one), so that the fallback kernels run, and are measured, on the GPU at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

HALF = (torch.float16, torch.bfloat16)
# The prefill's attention kernels (``Capability.prefill_kernel``, ``prefill_attention.py``).
PrefillKernel = Literal["flash", "efficient", "sdpa"]


@dataclass(frozen=True, slots=True)
class Capability:
    """A device's compute capability as the engine's choices read it; off CUDA, none."""

    cuda: bool
    version: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, device: torch.device, forced: str | None = None) -> Capability:
        """``device``'s capability, or ``forced`` ("7.5") where that is lower."""
        if device.type != "cuda":
            return cls(False)
        version = tuple(torch.cuda.get_device_capability(device))
        if forced:
            wanted = parse_version(forced)
            if wanted > version:
                raise RuntimeError(
                    f"fast_capability={forced}: this GPU has {version[0]}.{version[1]}; "
                    "only an older capability can be chosen"
                )
            version = wanted
        return cls(True, (int(version[0]), int(version[1])))

    @property
    def bfloat16(self) -> bool:
        """Whether bfloat16 runs natively (off CUDA it runs, slowly: float32 is chosen there)."""
        return not self.cuda or self.version >= (8, 0)

    def prefill_kernel(self, dtype: torch.dtype) -> PrefillKernel:
        """Which kernel attends a prefill's packed prompts: torch's FlashAttention-2 varlen
        kernel (8.0+, half precision), below 8.0 its memory-efficient varlen kernel (CUTLASS,
        float16: a T4's), both one launch a layer that a CUDA graph can hold; elsewhere (a CPU,
        float32, bfloat16 below 8.0) SDPA one prompt at a time, split on the host."""
        if not self.cuda or dtype not in HALF:
            return "sdpa"
        if self.version >= (8, 0):
            return "flash"
        return "efficient" if dtype == torch.float16 else "sdpa"

    @property
    def fp8(self) -> bool:
        """Whether FP8 weights run (``torch._scaled_mm``)."""
        return self.cuda and self.version >= (8, 9)

    @property
    def wide_four_bit(self) -> bool:
        """Whether 4-bit batches of 65-128 rows take ``four_bit_matmul``'s wide tile: its
        93,184 bytes of shared memory a block on 8.0+ (99 KiB on an A10, RTX 3090 or 4090);
        131,072 on 7.5, past a T4's 64 KiB."""
        return self.cuda and self.version >= (8, 0)

    @property
    def pdl(self) -> bool:
        """Whether kernels may launch with programmatic dependent launch."""
        return self.cuda and self.version >= (9, 0)

    def check_quantization(self, quantization: str) -> None:
        """Refuse a quantization this GPU cannot run (FP8 before 8.9); a CPU emulates it."""
        if quantization == "fp8" and self.cuda and not self.fp8:
            major, minor = self.version
            raise RuntimeError(
                f"quantization=fp8 needs compute capability 8.9 (Ada, Hopper); this GPU has "
                f"{major}.{minor}: use nf4 or int8, or no quantization"
            )

    def auto_dtype(self) -> torch.dtype:
        """The weights' dtype for ``dtype=auto``: bfloat16 where the GPU has it, float16 on an
        older GPU, float32 on a CPU (half precision is slow or emulated there)."""
        if not self.cuda:
            return torch.float32
        return torch.bfloat16 if self.bfloat16 else torch.float16


def parse_version(text: str) -> tuple[int, int]:
    """``"8.9"`` as ``(8, 9)``."""
    major, _, minor = text.strip().partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(f"a compute capability is written like 7.5, not {text!r}") from None
