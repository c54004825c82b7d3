"""Model folders built once under ``data_dir`` (the demo model, random-weight checkpoints)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(staging_folder)`` first if it holds no ``config.json``.

    The folder is written beside its final place and renamed into it, so a crash never leaves a
    half-built model behind and two processes building at once both end with a whole one.
    """
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process built it first: theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
