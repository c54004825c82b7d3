"""Plain ``generate()`` with eager and with compiled norms, in one process on one machine.

The naive baseline's speed depends on the host CPU (batch-1 eager decoding is launch-bound), so
the effect of ``HYMT_COMPILE_NORMS`` on it is measured within one process: eager, compiled, and
eager again (compilation undone), each on the same requests after a warm-up.

    HYMT_LOAD_FORMAT=dummy python -m loadtests.gpu.norms_ab --requests 5 --report norms_ab.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadtests.baseline import NaiveGenerator, service_requests
from service.config import Settings
from service.engine.compilation import compile_norms
from service.engine.loading import load_model


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.gpu.norms_ab", description=__doc__)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    settings = Settings()
    loaded = load_model(settings.model_copy(update={"compile_norms": "off"}).engine_config())
    requests = service_requests(settings, loaded, args.requests + 1, seed=0)
    naive = NaiveGenerator(loaded)
    norms = [m for m in loaded.model.modules() if type(m).__name__.endswith("RMSNorm")]
    report: dict[str, float] = {}
    for label in ("eager", "compiled", "eager_again"):
        if label == "compiled":
            compile_norms(loaded.model)
        if label == "eager_again":
            for module in norms:
                module._compiled_call_impl = None  # what nn.Module.compile() set
        for _ in range(2):  # warm-up; compiles on the first call
            naive(requests[0])
        tokens, seconds = naive.timed(requests[1:])
        report[f"{label}_ms_per_token"] = round(1000 * seconds / tokens, 2)
        print(label, tokens, report[f"{label}_ms_per_token"], flush=True)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
