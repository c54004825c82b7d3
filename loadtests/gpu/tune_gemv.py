"""Write the one-row kernel's block sizes (``gemv.TUNED``) from a sweep's report.

    python -m loadtests.kernels --gemv-sweep --report kernels.json   # on the GPU
    python -m loadtests.gpu.tune_gemv kernels.json                    # rewrites gemv.py

The table sits between the ``# tuned: begin`` and ``# tuned: end`` lines of
``service/engine/fast/gemv.py``; each swept shape gets its fastest config.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service.engine.fast import gemv

BEGIN, END = "# tuned: begin\n", "# tuned: end\n"


def table(report: Mapping[str, Any]) -> str:
    """The ``TUNED`` assignment for the sweep in ``report`` (``loadtests.kernels``' JSON)."""
    sweep = report["gemv_sweep"]
    assert isinstance(sweep, dict)
    lines = ["TUNED: dict[tuple[int, int, int], GemvConfig] = {"]
    for row in sweep.values():
        if not isinstance(row, dict) or "best" not in row:
            continue
        best = row["best"][0]
        key = f"({row['outputs']}, {row['inputs']}, {row['weight_bytes']})"
        config = f"GemvConfig({best['block_n']}, {best['block_k']}, {best['warps']}, "
        lines.append(f"    {key}: {config}{best['stages']}),")
    return "\n".join([*lines, "}"]) + "\n"


def rewrite(source: str, assignment: str) -> str:
    head, rest = source.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + assignment + END + tail


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.gpu.tune_gemv", description=__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("--module", type=Path, default=Path(gemv.__file__))
    args = parser.parse_args(argv)
    assignment = table(json.loads(args.report.read_text()))
    args.module.write_text(rewrite(args.module.read_text(), assignment))
    print(assignment, end="")


if __name__ == "__main__":
    main()
