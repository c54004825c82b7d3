"""Where the time goes: the fast engine measured without HTTP, and profiled.

Loads the model as the service does (``HYMT_*`` settings), builds the service's own engine and the
exact requests the load generator's texts become, and measures, in one process:

- ``lone``: requests one at a time on the idle engine: wall time per output token, and with
  ``torch.profiler`` around one of them, the time the GPU was busy (sum of kernel times) per
  token. Wall minus GPU is host-side time in which the GPU waited.
- ``throughput``: all requests submitted at once (or ``--concurrency`` of them kept in flight,
  a steady state): output tokens/s of the engine alone. Set beside
  the HTTP figure of ``loadtests.bench`` for the same requests, the difference is what HTTP, JSON,
  the translator and the scheduler cost. For the fast engine, its step loop meanwhile
  (``throughput_step_loop``): steps, the ms per step of prefill, decode launch, waiting for the
  device and the host's own work, and the waiting's share (the device keeping the host busy).
- kernels launched per token in the profiled request.
- the profile's top kernels by GPU time and by launches per token, for the report; ``--trace``
  also writes the kernels of two decode steps in launch order.
- with ``--window-after S``: ``torch.profiler`` (kernels only) over ``--window`` seconds of the
  throughput phase from S seconds in, a steady state's kernels in ms per decode step, by kernel
  and by kind (matrix products, attention, the rest): where a full step's device time goes.

    HYMT_LOAD_FORMAT=dummy python -m loadtests.profile --requests 1024 --report profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from loadtests.baseline import service_requests
from loadtests.loadgen import Outcome, emit, steady_state
from loadtests.timeline import summarize
from service.config.settings import Settings
from service.contract.errors import ServiceError
from service.contract.types import Engine, GenerationRequest, GenerationResult
from service.engine.fast.engine import FastEngine
from service.engine.fast.step import StepTimes
from service.engine.loading import load_model
from service.logs import configure_logging


@dataclass
class ProfileReport:
    engine: str
    engine_build_s: float
    attention: str
    lone_requests: int
    lone_output_tokens: int
    lone_wall_ms_per_token: float
    profiled_output_tokens: int
    profiled_wall_ms_per_token: float
    profiled_gpu_busy_ms_per_token: float
    profiled_kernels_per_token: float
    throughput_requests: int
    # Requests kept in flight (0: all submitted at once).
    throughput_concurrency: int
    throughput_output_tokens: int
    throughput_duration_s: float
    throughput_output_tokens_per_s: float
    # A closed loop's steady state (``loadgen.steady_state``: from the clients' first turnover to
    # the last request sent), without the filling and the drain; None where there is none.
    steady_output_tokens_per_s: float | None = None
    steady_window_s: float | None = None
    top_kernels_ms: dict[str, float] = field(default_factory=dict)
    kernel_launches_per_token: dict[str, float] = field(default_factory=dict)
    engine_plan: dict[str, object] = field(default_factory=dict)
    max_memory_allocated_bytes: int = 0
    throughput_timeline: dict[str, float] = field(default_factory=dict)
    # The fast engine's step loop while the throughput requests ran (``_step_loop``).
    throughput_step_loop: dict[str, float] = field(default_factory=dict)
    # Per batch-size bucket: the engine's decode step measured at start with empty rows
    # (``step_ms``), and the device's mean ms per decode step of that bucket while the
    # throughput requests ran (real contexts; on a GPU).
    step_ms_at_start: dict[int, float] = field(default_factory=dict)
    device_decode_ms_by_bucket: dict[int, float] = field(default_factory=dict)
    # The loaded window (``--window-after``): its decode steps and prefills, the kernels' ms per
    # decode step by name (top 30) and by kind, and the kernels' busy share of the window.
    loaded_window: dict[str, object] = field(default_factory=dict)


def _resolver(
    future: asyncio.Future[GenerationResult | ServiceError],
) -> Callable[[GenerationResult | ServiceError, float, float], None]:
    def resolve(result: GenerationResult | ServiceError, _queued: float, _ran: float) -> None:
        future.set_result(result)

    return resolve


@dataclass
class ClosedLoop:
    """A closed loop's answers as the load generator records them (``loadgen.Outcome``, seconds
    from ``started``) and when its last request was sent: what ``loadgen.steady_state`` reads."""

    started: float
    outcomes: list[Outcome] = field(default_factory=list)
    last_sent_s: float = 0.0


async def _generate(
    engine: Engine,
    requests: list[GenerationRequest],
    prefix: str,
    concurrency: int = 0,
    closed: ClosedLoop | None = None,
) -> int:
    """Submit ``requests`` at once, or with ``concurrency`` keep that many in flight (a closed
    loop: each answer lets the next request in, a steady state, recorded in ``closed``); the
    output tokens of all."""
    if concurrency and concurrency < len(requests):
        lanes = [requests[lane::concurrency] for lane in range(concurrency)]
        record = closed or ClosedLoop(time.perf_counter())
        counts = await asyncio.gather(
            *(
                _one_after_another(engine, lane, f"{prefix}-{i}", record)
                for i, lane in enumerate(lanes)
            )
        )
        return sum(counts)
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[GenerationResult | ServiceError]] = []
    for index, request in enumerate(requests):
        future: asyncio.Future[GenerationResult | ServiceError] = loop.create_future()
        futures.append(future)
        engine.submit(f"{prefix}-{index}", request, _resolver(future))
    tokens = 0
    for result in await asyncio.gather(*futures):
        if isinstance(result, ServiceError):
            raise result
        tokens += result.completion_tokens
    return tokens


async def _one_after_another(
    engine: Engine, requests: list[GenerationRequest], prefix: str, loop: ClosedLoop
) -> int:
    tokens = 0
    for index, request in enumerate(requests):
        loop.last_sent_s = time.perf_counter() - loop.started
        generated = await _generate(engine, [request], f"{prefix}-{index}")
        finished = time.perf_counter() - loop.started
        loop.outcomes.append(Outcome(200, 0.0, output_tokens=generated, finished_s=finished))
        tokens += generated
    return tokens


async def run(
    settings: Settings,
    requests: int,
    lone: int,
    seed: int,
    trace_path: Path | None = None,
    concurrency: int = 0,
    window: tuple[float, float] | None = None,
) -> ProfileReport:
    config = settings.engine_config()
    loaded = load_model(config)
    # Prepared before the fast engine takes the weights out of the model.
    prepared = service_requests(settings, loaded, requests + lone + 2, seed)
    built = time.perf_counter()
    engine = FastEngine(loaded, config)
    build_s = time.perf_counter() - built
    cuda = loaded.device.type == "cuda"
    try:
        await _generate(engine, prepared[:1], "warm")

        started, tokens = time.perf_counter(), 0
        for index in range(lone):
            tokens += await _generate(engine, [prepared[1 + index]], f"lone{index}")
        lone_wall = time.perf_counter() - started

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as trace:
            started = time.perf_counter()
            profiled_tokens = await _generate(engine, [prepared[1 + lone]], "profiled")
            profiled_wall = time.perf_counter() - started
        # Kernels only: a CPU operator's device time repeats the time of the kernels it launched.
        kernels = [event for event in trace.key_averages() if event.device_type == DeviceType.CUDA]
        busy_us = sum(event.self_device_time_total for event in kernels)
        launches = sum(event.count for event in kernels)
        kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
        top = {e.key[:80]: round(e.self_device_time_total / 1000, 2) for e in kernels[:12]}
        kernels.sort(key=lambda event: event.count, reverse=True)
        per_token = max(profiled_tokens, 1)
        counts = {e.key[:80]: round(e.count / per_token, 2) for e in kernels[:40]}
        if trace_path is not None:
            _write_step_kernels(trace, launches / per_token, trace_path)

        batch = prepared[2 + lone :]
        samples: list[tuple[float, int]] = []
        before = engine.step_times()
        started = time.perf_counter()
        sampler = asyncio.create_task(_sample(engine, started, samples))
        watching: asyncio.Task[dict[str, object]] | None = None
        if window is not None:
            watching = asyncio.create_task(_loaded_window(engine, cuda, *window))
        closed = ClosedLoop(started)
        batch_tokens = await _generate(engine, batch, "load", concurrency, closed)
        batch_wall = time.perf_counter() - started
        steady = steady_state(closed.outcomes, concurrency, closed.last_sent_s)
        sampler.cancel()
        loaded_window = await watching if watching is not None else {}
        after = engine.step_times()
        loop = _step_loop(before, after, batch_wall)
        by_bucket = _by_bucket(before, after)
    finally:
        engine.close()
    return ProfileReport(
        engine="fast",
        engine_build_s=round(build_s, 2),
        attention=engine.info.attention,
        lone_requests=lone,
        lone_output_tokens=tokens,
        lone_wall_ms_per_token=round(1000 * lone_wall / max(tokens, 1), 2),
        profiled_output_tokens=profiled_tokens,
        profiled_wall_ms_per_token=round(1000 * profiled_wall / max(profiled_tokens, 1), 2),
        profiled_gpu_busy_ms_per_token=round(busy_us / 1000 / max(profiled_tokens, 1), 2),
        profiled_kernels_per_token=round(launches / max(profiled_tokens, 1), 1),
        throughput_requests=len(batch),
        throughput_concurrency=concurrency,
        throughput_output_tokens=batch_tokens,
        throughput_duration_s=round(batch_wall, 3),
        throughput_output_tokens_per_s=round(batch_tokens / batch_wall, 1),
        steady_output_tokens_per_s=None if steady is None else round(steady[0], 1),
        steady_window_s=None if steady is None else round(steady[1], 3),
        top_kernels_ms=top,
        kernel_launches_per_token=counts,
        engine_plan=asdict(engine.plan),
        max_memory_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else 0,
        throughput_timeline=asdict(summarize(samples, batch_wall)),
        throughput_step_loop=loop,
        step_ms_at_start={b: round(1000 * s, 3) for b, s in engine.step_seconds().items()},
        device_decode_ms_by_bucket=by_bucket,
        loaded_window=loaded_window,
    )


def _by_bucket(before: StepTimes, after: StepTimes) -> dict[int, float]:
    """The device's mean ms per decode step of each bucket between ``before`` and ``after``."""
    means = {}
    for bucket, (seconds, steps) in after.device_decode_by_bucket.items():
        was_seconds, was_steps = before.device_decode_by_bucket.get(bucket, (0.0, 0))
        if steps > was_steps:
            means[bucket] = round(1000 * (seconds - was_seconds) / (steps - was_steps), 3)
    return dict(sorted(means.items()))


def _step_loop(before: StepTimes, after: StepTimes, wall_s: float) -> dict[str, float]:
    """The fast engine's step loop during the throughput phase: steps, and per step the ms of
    each part (``StepTimes``); ``wait_share``: the part of the loop the host spent waiting for
    the device (near zero: the device waited for the host); how full the decode batches ran and
    how much the prefills took; the device's own time on each (on a GPU) and its busy share of
    the wall time (what is left is the device idle, waiting for the host)."""

    def delta(name: str) -> float:
        return float(getattr(after, name) - getattr(before, name))

    steps = max(int(delta("steps")), 1)
    decodes, prefills = int(delta("decodes")), int(delta("prefills"))
    parts = {name: delta(name) for name in ("prefill_s", "launch_s", "wait_s", "host_s")}
    total = sum(parts.values())
    device = delta("device_prefill_s") + delta("device_decode_s")
    return {
        "steps": int(delta("steps")),
        "decode_steps": decodes,
        **{
            f"{name[:-2]}_ms_per_step": round(1000 * value / steps, 3)
            for name, value in parts.items()
        },
        "wait_share": round(parts["wait_s"] / total, 3) if total else 0.0,
        "loop_share_of_wall": round(total / wall_s, 3) if wall_s else 0.0,
        "mean_decode_rows": round(delta("decode_rows") / decodes, 1) if decodes else 0.0,
        "prefill_steps": prefills,
        # Of those, replayed as a captured graph (the engine's small prefill steps).
        "graph_prefill_steps": int(delta("graph_prefills")),
        "prefill_tokens_per_prefill": (
            round(delta("prefill_tokens") / prefills, 1) if prefills else 0.0
        ),
        # Prompt tokens whose keys and values came from kept prefixes instead of a prefill.
        "reused_tokens_per_prefill": (
            round(delta("reused_tokens") / prefills, 1) if prefills else 0.0
        ),
        # The host's launching of a prefill (``StepTimes.prefill_launch_s``).
        "prefill_launch_ms_per_prefill": (
            round(1000 * delta("prefill_launch_s") / prefills, 3) if prefills else 0.0
        ),
        "device_prefill_ms_per_prefill": (
            round(1000 * delta("device_prefill_s") / prefills, 3) if prefills else 0.0
        ),
        "device_decode_ms_per_decode": (
            round(1000 * delta("device_decode_s") / decodes, 3) if decodes else 0.0
        ),
        "device_busy_share_of_wall": round(device / wall_s, 3) if wall_s else 0.0,
    }


def _write_step_kernels(trace: profile, per_token: float, path: Path) -> None:
    """The kernels of about two decode steps from the middle of the profiled request, in launch
    order with their GPU microseconds: which operation each of a step's kernels comes from."""
    found = trace.events()  # type: ignore[no-untyped-call]
    events = [e for e in found if e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    middle, width = len(events) // 2, int(2 * per_token)
    window = events[middle : middle + width]
    path.write_text(
        json.dumps([[e.name[:120], round(e.time_range.elapsed_us(), 2)] for e in window])
    )


# Kernel names by kind, first match wins: cuBLAS/CUTLASS products (and FP8's scaled ones),
# then attention (FlexAttention's templates, FlashAttention, the engine's own decode kernel).
_KINDS = (
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|_scaled_mm|gemv", re.I)),
    ("attention", re.compile(r"flex|triton_tem|flash|paged_decode|attention", re.I)),
)


async def _loaded_window(
    engine: FastEngine, cuda: bool, after_s: float, window_s: float
) -> dict[str, object]:
    """Kernels only, over ``window_s`` seconds from ``after_s`` into the throughput phase: ms per
    decode step by kernel (top 30) and by kind, the steps and prefills the window held, and the
    kernels' share of the window (the device's busy share, profiling's own cost included); and
    the step loop (``_step_loop``) over the ``window_s`` seconds just before, unprofiled."""
    # The step loop unprofiled, for as long again just before (the profiler slows the host).
    await asyncio.sleep(max(after_s - window_s, 0.0))
    unprofiled = engine.step_times()
    began = time.perf_counter()
    await asyncio.sleep(min(after_s, window_s))
    before = engine.step_times()
    step_loop = _step_loop(unprofiled, before, time.perf_counter() - began)
    # (Off a GPU the window counts steps and finds no kernels: the tests run it there.)
    trace = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
    trace.start()
    started = time.perf_counter()
    await asyncio.sleep(window_s)
    trace.stop()
    wall = time.perf_counter() - started
    after = engine.step_times()
    decodes = max(after.decodes - before.decodes, 1)
    kernels = [e for e in trace.key_averages() if e.device_type == DeviceType.CUDA]
    kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
    kinds: dict[str, float] = {}
    for event in kernels:
        kind = next((k for k, pattern in _KINDS if pattern.search(event.key)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + event.self_device_time_total
    busy_us = sum(kinds.values())
    if after.decodes == before.decodes:
        # Nothing in it: the throughput phase ended first (too few requests for the window).
        print(
            f"the loaded window ({after_s} s into the throughput phase) found no decode step: "
            "more --requests or an earlier --window-after",
            file=sys.stderr,
        )
    return {
        "missed": after.decodes == before.decodes,
        "seconds": round(wall, 3),
        "decode_steps": after.decodes - before.decodes,
        "prefills": after.prefills - before.prefills,
        "prefill_tokens": after.prefill_tokens - before.prefill_tokens,
        "mean_decode_rows": round((after.decode_rows - before.decode_rows) / decodes, 1),
        "busy_share": round(busy_us / 1e6 / wall, 3) if wall else 0.0,
        "ms_per_step_by_kind": {k: round(us / 1000 / decodes, 3) for k, us in kinds.items()},
        "ms_per_step_by_kernel": {
            e.key[:100]: round(e.self_device_time_total / 1000 / decodes, 3) for e in kernels[:30]
        },
        "launches_per_step_by_kernel": {
            e.key[:100]: round(e.count / decodes, 2) for e in kernels[:30]
        },
        "unprofiled_step_loop": step_loop,
    }


async def _sample(engine: Engine, started: float, samples: list[tuple[float, int]]) -> None:
    while True:
        samples.append((time.perf_counter() - started, engine.running() or 0))
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> ProfileReport:
    parser = argparse.ArgumentParser(prog="python -m loadtests.profile", description=__doc__)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--lone", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--trace", type=Path, help="write two decode steps' kernels in order")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="keep this many requests in flight (a closed loop); 0 submits all at once",
    )
    parser.add_argument(
        "--window-after",
        type=float,
        help="profile the throughput phase's kernels from this many seconds in (on a GPU)",
    )
    parser.add_argument("--window", type=float, default=2.0, help="seconds the window lasts")
    args = parser.parse_args(argv)
    # The engine's own log lines (what fits, the attention measured, graphs captured) on stderr.
    configure_logging("info", process="engine")
    window = None if args.window_after is None else (args.window_after, args.window)
    report = asyncio.run(
        run(Settings(), args.requests, args.lone, args.seed, args.trace, args.concurrency, window)
    )
    emit(report, args.report)
    return report


if __name__ == "__main__":
    main()
