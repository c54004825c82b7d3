"""Runs Triton's compiler over kernel launches for a GPU (sm_90 unless a launch names another
compute capability), for ``test_kernels_compile.py``.

A process of its own: the tests run Triton's interpreter (``TRITON_INTERPRET=1``), which changes
what ``triton.language`` is at import, and the compiler needs it unchanged. Reads a JSON list of
launches (module, kernel, signature, constexpr values, launch options, and ``full``: the whole
way to a cubin with Triton's own ptxas rather than the front end only; ``arch``: the compute
capability as 75, 86..., 90 when absent) on stdin and prints, per
launch, ``ok`` (with the shared memory a full compile's launch needs) or the compiler's error.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource


def front_end(launch: dict[str, Any]) -> str:
    """``ok`` (``ok shared=N`` after a full compile), or why the launch's kernel does not
    compile for its target, or which of the launch's ``expect`` strings its Triton IR lacks."""
    kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    names = list(inspect.signature(kernel.fn).parameters)
    values = {(names.index(name),): value for name, value in launch["constexprs"].items()}
    target = GPUTarget("cuda", launch.get("arch", 90), 32)
    launch_options = {"enable_fp_fusion": True, **launch["options"]}
    if launch["full"]:
        try:
            compiled = triton.compile(
                ASTSource(kernel, launch["signature"], values), target=target,
                options=launch_options,
            )  # fmt: skip
        except Exception as error:  # the compiler's message is the result
            return f"{type(error).__name__}: {error}"
        return _lacking(launch, compiled.asm["ttir"]) or f"ok shared={compiled.metadata.shared}"
    backend = CUDABackend(target)
    options = backend.parse_options(launch_options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        module = ASTSource(kernel, launch["signature"], values).make_ir(
            target, options, backend.get_codegen_implementation(options),
            backend.get_module_map(), context,
        )  # fmt: skip
    except Exception as error:  # the compiler's message is the result
        return f"{type(error).__name__}: {error}"
    text = str(module)
    return _lacking(launch, text) or ("ok" if "tt.func" in text else "no function in the IR")


def _lacking(launch: dict[str, Any], ir: str) -> str:
    """Which of the launch's ``expect`` strings the IR lacks ("" when none)."""
    missing = [wanted for wanted in launch.get("expect", []) if wanted not in ir]
    return f"the IR lacks {missing}" if missing else ""


if __name__ == "__main__":
    print(json.dumps([front_end(launch) for launch in json.load(sys.stdin)]))
