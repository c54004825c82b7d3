"""Where torch.compile keeps what it compiled, so a restart does not compile again.

Inductor's FX graph cache and Triton's kernel cache live under the service's data folder
(``compile-cache/``) unless the environment already names a place: the engine process's first
start compiles, later starts load the compiled kernels from disk. Set before the first compile,
in the engine process only.
"""

from __future__ import annotations

import os
from pathlib import Path


def use_compile_cache(data_dir: Path) -> Path:
    folder = data_dir / "compile-cache"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
    return folder
