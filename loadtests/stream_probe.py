"""Where streamed text is held back: one lone streamed request on the continuous engine, with
each delivery of transformers' streamed outputs recorded (time, tokens generated so far, length
of the text the engine may send). Calls far fewer than tokens: the outputs come in bursts;
calls per token but a text that does not grow: the text is held back (incomplete characters,
trailing whitespace).

    HYMT_LOAD_FORMAT=dummy python -m loadtests.stream_probe --report probe.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.baseline import service_requests
from service.config.settings import Settings
from service.contract.errors import ServiceError
from service.contract.types import GenerationResult
from service.engine.continuous import ContinuousBatchingEngine
from service.engine.loading import load_model


async def probe(settings: Settings, repeats: int) -> dict[str, object]:
    loaded = load_model(settings.engine_config())
    engine = ContinuousBatchingEngine(loaded, settings.engine_config())
    requests = service_requests(settings, loaded, repeats + 1, 0)
    calls: list[tuple[float, int, int]] = []
    detokenizer = engine._detokenizer  # the probe watches the engine's own calls
    original = detokenizer.prefix

    def watched(generated: Sequence[int]) -> str:
        text = original(generated)
        calls.append((time.perf_counter(), len(generated), len(text)))
        return text

    detokenizer.prefix = watched  # type: ignore[method-assign]
    runs: list[dict[str, object]] = []
    try:
        for index, request in enumerate(requests):
            calls.clear()
            loop = asyncio.get_running_loop()
            done: asyncio.Future[GenerationResult | ServiceError] = loop.create_future()
            grown: list[int] = []
            started = time.perf_counter()

            def finish(
                result: GenerationResult | ServiceError,
                _queued: float,
                _ran: float,
                done: asyncio.Future[GenerationResult | ServiceError] = done,
            ) -> None:
                done.set_result(result)

            def grow(text: str, grown: list[int] = grown) -> None:
                grown.append(len(text))

            engine.submit(f"probe-{index}", request, finish, grow)
            result = await done
            finished = time.perf_counter() - started
            if isinstance(result, ServiceError):
                raise result
            if index == 0:
                continue  # warm-up
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(calls)]
            runs.append(
                {
                    "tokens": result.completion_tokens,
                    "seconds": round(finished, 4),
                    "deliveries": len(calls),
                    "tokens_seen": [c[1] for c in calls][:60],
                    "sendable_chars": [c[2] for c in calls][:60],
                    "distinct_sendable_lengths": len(set(grown)),
                    "first_delivery_s": round(calls[0][0] - started, 4) if calls else None,
                    "largest_gap_ms": round(1000 * max(gaps), 2) if gaps else None,
                    "text_start": result.text[:80],
                }
            )
    finally:
        engine.close()
    return {"runs": runs}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.stream_probe", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--report", default=None)
    args = parser.parse_args(argv)
    settings = Settings()
    report = asyncio.run(probe(settings, args.repeats))
    text = json.dumps(report, indent=2)
    if args.report is not None:
        Path(args.report).write_text(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
