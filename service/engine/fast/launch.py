"""How the engine's own Triton kernels (``gemv``, ``rope``, ``attention.TritonDecode``) are
launched: plainly, or with programmatic dependent launch (PDL).

With PDL (compute capability 9.0+) a kernel may be launched while the one before it on the
stream is still running: each of these kernels, built with ``pdl``, first waits for the kernel
before it to finish and make its writes visible (``gdc_wait``), then lets the next one start
launching (``gdc_launch_dependents``), so a launch and a kernel's start overlap the previous
kernel's end instead of following it. Inside ``torch.compile`` a kernel cannot be given the
launch option (dynamo passes only its arguments and the block configuration), so PDL is for
kernels launched eagerly, in a CUDA graph's capture.

Triton's interpreter (the tests on a CPU) takes the launch option but has no ``gdc_*``
instructions: off CUDA the kernels are built without them. Triton has both since 3.4; with an
older one (an older torch) the engine launches plainly.
"""

from __future__ import annotations

import importlib.util

import torch

# The first Triton with the gdc_* instructions and the launch_pdl option.
FIRST_TRITON = (3, 4)


def supported() -> bool:
    """Whether this Triton builds and launches kernels with PDL."""
    if importlib.util.find_spec("triton") is None:
        return False
    import triton
    import triton.language as tl

    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    cuda = getattr(getattr(tl, "extra", None), "cuda", None)
    instructions = all(hasattr(cuda, name) for name in ("gdc_wait", "gdc_launch_dependents"))
    return version >= FIRST_TRITON and instructions


def pdl_args(pdl: bool, device: torch.device) -> dict[str, bool]:
    """The keyword arguments of a launch: the kernel's ``pdl`` flag and, with PDL, the launch
    option."""
    if not pdl:
        return {"pdl": False}
    return {"pdl": device.type == "cuda", "launch_pdl": True}
