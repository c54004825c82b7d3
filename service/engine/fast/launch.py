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
instructions: off CUDA the kernels are built without them.
"""

from __future__ import annotations

import torch


def pdl_args(pdl: bool, device: torch.device) -> dict[str, bool]:
    """The keyword arguments of a launch: the kernel's ``pdl`` flag and, with PDL, the launch
    option."""
    if not pdl:
        return {"pdl": False}
    return {"pdl": device.type == "cuda", "launch_pdl": True}
