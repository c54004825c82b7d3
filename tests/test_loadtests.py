"""The benchmark tools run end to end on the demo model (the GPU runs use the same code)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.server
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loadtests import (
    baseline,
    bench,
    counting,
    cpu_time,
    doorway,
    fidelity,
    ipc,
    kernels,
    loadgen,
    overload,
    profile,
    quant_kernels,
)
from loadtests.stack import free_port
from loadtests.timeline import summarize
from service.contract.protocol import Stats
from service.frontend.metrics import Metrics
from service.frontend.stalls import StallMonitor
from tests.conftest import MakeSettings


def test_baseline_does_the_work_the_service_would(make_settings: MakeSettings) -> None:
    settings = make_settings(max_new_tokens=8)
    report = baseline.run(settings, requests=3, seed=0)
    # Generation is forced to each request's budget: 3 requests x 8 tokens at most, 3 at least.
    assert report.requests == 3
    assert 3 <= report.output_tokens <= 24
    assert report.output_tokens_per_s > 0


async def test_profile_measures_the_engine_without_http(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    settings = make_settings(max_new_tokens=8)
    steps = tmp_path / "kernels.json"
    report = await profile.run(settings, requests=6, lone=2, seed=0, trace_path=steps)
    assert json.loads(steps.read_text()) == []  # a step's kernels, in order: none on a CPU
    assert report.throughput_requests == 6
    assert 6 <= report.throughput_output_tokens <= 48
    assert report.lone_output_tokens > 0
    assert report.lone_wall_ms_per_token > 0
    assert report.attention == "paged-gather"  # the CPU default
    assert report.profiled_gpu_busy_ms_per_token == 0.0  # no CUDA kernels on a CPU
    # Sampled every 50 ms: on a busy 2-core machine six short requests can all finish between
    # two samples, so only the timeline's shape is certain here.
    timeline = report.throughput_timeline
    assert timeline["samples"] >= 1
    assert 0 <= timeline["peak_running"] <= 6


async def test_profile_keeps_a_closed_loop_and_says_how_full_the_steps_ran(
    make_settings: MakeSettings,
) -> None:
    settings = make_settings(max_new_tokens=8)
    report = await profile.run(
        settings, requests=8, lone=0, seed=0, concurrency=2, window=(0.0, 0.5)
    )
    assert report.throughput_concurrency == 2
    # Two lanes of four: after the first two answers, a window up to the last request sent.
    assert report.steady_window_s is not None
    assert report.steady_window_s > 0
    assert report.steady_output_tokens_per_s is not None
    assert report.steady_output_tokens_per_s > 0
    loop = report.throughput_step_loop
    # Two in flight: no decode step ran more than two rows, and every prompt was prefilled.
    assert 1 <= loop["mean_decode_rows"] <= 2
    assert loop["prefill_steps"] >= 4
    assert loop["prefill_tokens_per_prefill"] > 0
    assert loop["device_busy_share_of_wall"] == 0.0  # nothing is timed off a GPU
    # The loaded window saw steps of the throughput phase, and (off a GPU) no kernels.
    window = report.loaded_window
    assert isinstance(window["decode_steps"], int)
    assert window["decode_steps"] > 0
    assert window["missed"] is False
    assert 1 <= float(window["mean_decode_rows"]) <= 2  # type: ignore[arg-type]
    assert window["ms_per_step_by_kind"] == {}
    # The host's share of the prefills is told apart from the wait for their first tokens.
    launching = loop["prefill_launch_ms_per_prefill"] * loop["prefill_steps"]
    assert 0 < launching <= loop["prefill_ms_per_step"] * loop["steps"] + 0.01
    assert "prefill_launch_ms_per_prefill" in window["unprofiled_step_loop"]  # type: ignore[operator]


async def test_a_loaded_window_after_the_load_ended_says_it_missed(
    make_settings: MakeSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window that begins after the throughput phase has nothing to profile: it says so (a
    GPU run that asked for too few requests got a report of zeros, read as a result)."""
    settings = make_settings(max_new_tokens=4)
    report = await profile.run(
        settings, requests=2, lone=0, seed=0, concurrency=2, window=(3.0, 0.1)
    )
    assert report.loaded_window["missed"] is True
    assert report.loaded_window["decode_steps"] == 0
    assert "found no decode step" in capsys.readouterr().err


async def test_fidelity_of_int8_weights_against_their_dequantized_numbers(
    make_settings: MakeSettings,
) -> None:
    # bitsandbytes' own int8 forward rounds activations to int8 too; the engine multiplies the
    # dequantized rows with 16-bit activations: against those numbers every text is the same.
    settings = make_settings(
        engine="fast", quantization="int8", fast_num_pages=64, fast_page_size=16, fast_max_rows=4
    )
    report = await fidelity.run(settings, texts=2, crowd=3, max_new=4, dequantized=True)
    assert (report.identical_alone, report.identical_crowd) == (2, 2)
    assert report.logits_argmax_agreement == 1.0


async def test_fidelity_compares_the_fast_engine_with_generate(
    make_settings: MakeSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(
        engine="fast", dtype="float32", fast_num_pages=64, fast_page_size=16, fast_max_rows=4
    )
    cache = tmp_path / "reference.pt"
    report = await fidelity.run(settings, texts=2, crowd=3, max_new=4, reference_cache=cache)
    assert (report.identical_alone, report.identical_crowd) == (2, 2)
    assert report.first_difference_alone == report.gap_alone == []
    assert report.logits_positions == report.reference_tokens
    assert report.logits_argmax_agreement == 1.0
    assert report.engine_plan["pages"] == 64  # the engine's plan, as the report gives it
    # Taken up again (a cut-off device call): transformers' side comes from the file, and a
    # different count computes it anew.
    monkeypatch.setattr(fidelity, "reference_side", _refuse)
    again = await fidelity.run(settings, texts=2, crowd=3, max_new=4, reference_cache=cache)
    assert again.reference_tokens == report.reference_tokens
    assert again.identical_alone == 2
    with pytest.raises(AssertionError, match="computed anew"):
        await fidelity.run(settings, texts=1, crowd=3, max_new=4, reference_cache=cache)


def _refuse(*_args: object) -> fidelity.Reference:
    raise AssertionError("computed anew")


def test_fidelity_measures_how_close_a_difference_was() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.5, 0.25, 0.0]])
    # Identical, or one ends first: nothing to compare.
    assert fidelity._gap(logits, [1, 0], [1, 0], -1) is None
    assert fidelity._gap(logits, [1], [1, 2], 1) is None
    # At the second token transformers chose 0 (0.5) where the engine chose 1 (0.25).
    assert fidelity._gap(logits, [1, 0], [1, 1], 1) == 0.25


def test_the_kernel_bench_runs_every_variant() -> None:
    # On a CPU each variant runs once, untimed: the script and the products it compares work.
    report = kernels.main(["--smoke", "--rows", "1,2", "--context", "40"])
    assert set(report["attention_us"]) == set(kernels.FLEX_OPTIONS)
    timed = {"rows1", "rows2"}
    assert set(report["attention_us"]["default"]) == timed | {f"{r}_max_abs_diff" for r in timed}
    # On the CPU every FlexAttention option runs the same reference: the same outputs.
    for figures in report["attention_us"].values():
        assert figures["rows1_max_abs_diff"] < 1e-6
    projections = report["linear_one_row"]
    assert set(projections) == {name for name, _, _ in kernels.SHAPES}
    for row in projections.values():
        # The one-row reduction is the float product; FP8 is within its rounding.
        assert row["reduction_rel_error"] < 1e-5
        assert row["fp8-reduction_rel_error"] < 0.08


def test_the_timeline_finds_the_ramp_and_the_tail() -> None:
    samples = [(0.0, 0), (0.5, 4), (1.0, 10), (1.5, 10), (2.0, 6), (2.5, 2)]
    busy = [(0.5, 0.2), (1.0, 0.9), (1.5, 0.8), (2.0, 0.7), (2.5, 0.1)]
    timeline = summarize(samples, duration_s=3.0, busy=busy)
    assert (timeline.samples, timeline.peak_running) == (6, 10)
    assert timeline.ramp_s == 1.0  # first sample with 90% of the peak generating
    assert timeline.tail_s == 1.0  # since the last sample with half of the peak
    assert timeline.loaded_mean_running == 8.7  # (10 + 10 + 6) / 3: the samples from 1 s to 2 s
    assert timeline.loaded_device_busy == 0.8  # (0.9 + 0.8 + 0.7) / 3, over the same span
    assert summarize(samples, duration_s=3.0).loaded_device_busy is None  # not reported
    # The engine's running totals: what each gained from 1 s to 2 s, a share of that second.
    totals = [(t, {"wait": 0.25 * t, "device": t * t / 4}) for t, _ in samples]
    shares = summarize(samples, duration_s=3.0, totals=totals).loaded_shares
    assert shares == {"wait": 0.25, "device": 0.75}
    assert summarize(samples, duration_s=3.0, totals=totals[:2]).loaded_shares == {}


async def test_more_requests_than_a_socket_buffers_all_get_answers() -> None:
    """2,000 at once through the real engine process: more than ZeroMQ's default high-water
    mark of 1,000 messages, which once dropped the excess silently."""
    report = await asyncio.wait_for(ipc.measure(lone=10, burst=2000), timeout=60)
    assert report.burst_requests == 2000
    assert report.burst_us_per_request > 0


async def test_the_bench_reads_the_stall_counters_of_the_service() -> None:
    metrics = Metrics()
    monitor = StallMonitor(metrics, period_s=0.01)
    monitor.start()
    await asyncio.sleep(0.02)
    time.sleep(0.06)  # noqa: ASYNC251 - the stall being measured
    gc.collect()
    await asyncio.sleep(0.03)
    await monitor.stop()
    figures = bench.stalls_of(metrics.render().decode())
    assert figures["lag_samples"] >= 2
    assert figures["lag_over_0.05"] >= 1
    assert figures["lag_over_0.005"] >= figures["lag_over_0.01"] >= figures["lag_over_0.05"]
    assert figures["gc2_passes"] >= 1
    assert figures["gc2_seconds"] > 0


def test_the_bench_reads_the_engine_s_running_totals_of_the_service() -> None:
    metrics = Metrics()
    assert bench.engine_totals(metrics.render().decode()) == {}  # none reported yet
    loop = {"prefill_launch": 1.0, "wait": 2.5, "host": 0.5}
    stats = Stats(
        in_flight=0, running=0, answered=0, generated_tokens=0, memory={}, steps=3,
        device_seconds=4.0, loop_seconds=loop,
    )  # fmt: skip
    metrics.record_engine(stats)
    assert bench.engine_totals(metrics.render().decode()) == {**loop, "device": 4.0}


class _Refusing(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._reply(200, b'{"status":"ready"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply(429, b'{"error":{"code":"overloaded"}}')

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@contextlib.contextmanager
def _refusing() -> Iterator[str]:
    """The URL of a server (in a thread) that refuses every POST with 429."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_flood_client_counts_every_answer_on_warm_and_cold_connections() -> None:
    with _refusing() as url:
        for warm in (False, True):
            report = overload.flood(url, 24, 2, warm=warm)
            assert report.by_status == {"429": 24}
            assert report.lost == 0
            assert report.refusal_p99_ms > 0
            assert report.health_polls > 0


@pytest.mark.parametrize("doorway", [False, True])
def test_the_flood_floors_refuse_every_translation_and_answer_health(doorway: bool) -> None:
    port = free_port()
    command = [sys.executable, "-m", "loadtests.canned", "--port", str(port), "--processes", "1"]
    server = subprocess.Popen([*command, "--doorway"] if doorway else command)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        # The raw responder refuses whatever comes; the doorway lets what it does not refuse in.
        assert health.status_code == (200 if doorway else 429)
        report = overload.flood(url, 48, 2)
        assert report.by_status == {"429": 48}
        assert report.lost == 0
        refused = httpx.post(f"{url}/translate", json={"text": "x", "target_lang": "de"})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
    finally:
        server.terminate()
        server.wait(timeout=30)
    # Stopped, it stops its server processes too: nothing answers on the port any more.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)


def test_clients_come_from_distinct_loopback_addresses() -> None:
    addresses = [loadgen.source_address(n) for n in range(600)]
    assert addresses[:2] == ["127.0.0.2", "127.0.0.3"]
    assert addresses[250] == "127.0.1.2"  # never .0, .1 or the broadcast-looking .252 and up
    assert len(set(addresses)) == 600
    assert all(int(a.rsplit(".", 1)[1]) in range(2, 252) for a in addresses)


def test_the_load_generator_raises_its_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        loadgen.allow_open_files(lowered + 100)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(lowered + 100, hard)
        loadgen.allow_open_files(10)  # never lowered
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(lowered + 100, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_quant_kernels_smoke_runs_every_engine_format() -> None:
    # On a CPU: the engine's formats at a sixteenth of the 7B's layer, each equal to the product
    # over its own dequantized weight.
    report = quant_kernels.main(["--smoke", "--rows", "1,3"])
    one, three = report["products_us"]["rows1"], report["products_us"]["rows3"]
    for name in ("bf16", "nf4", "int8", "int4-reduction"):
        assert one[f"{name}_rel_error"] < 1e-5, name
    assert "int4-reduction_rel_error" not in three  # a one-row form only
    assert three["nf4_rel_error"] < 1e-5


@given(
    rate=st.integers(20, 200),
    ramp=st.floats(0.5, 5.0),
    tail=st.floats(0.5, 10.0),
    concurrency=st.integers(1, 8),
)
def test_the_steady_state_leaves_out_the_ramp_and_the_drain(
    rate: int, ramp: float, tail: float, concurrency: int
) -> None:
    # ``concurrency`` slow answers while the engine fills, then answers of 10 tokens at ``rate``
    # per second for 4 s until the last request is sent, then a slow drain: the steady figure
    # is the middle's rate alone, whatever the ramp and the tail.
    def answer(at: float, tokens: int = 10) -> loadgen.Outcome:
        return loadgen.Outcome(status=200, latency_s=1.0, output_tokens=tokens, finished_s=at)

    filling = [answer(ramp * (n + 1) / concurrency, tokens=1) for n in range(concurrency)]
    steady = [answer(ramp + (n + 1) / rate) for n in range(4 * rate)]
    drained = ramp + 4.0
    draining = [answer(drained + tail * (n + 1) / 3, tokens=500) for n in range(3)]
    refused = [loadgen.Outcome(status=429, latency_s=0.01, finished_s=ramp + 1)]
    found = loadgen.steady_state(filling + steady + draining + refused, concurrency, drained)
    assert found is not None
    tokens_per_s, window = found
    assert window == pytest.approx(4.0)
    assert tokens_per_s == pytest.approx(10 * rate, rel=1e-6)
    # Too few answers for a first turnover: no steady state.
    assert loadgen.steady_state(filling, concurrency, drained) is None


@given(cpus=st.sets(st.integers(0, 255), min_size=1))
def test_a_cpu_list_reads_as_taskset_writes_it(cpus: set[int]) -> None:
    ordered, runs = sorted(cpus), list[list[int]]()
    for cpu in ordered:  # consecutive cores as one range, the way taskset lists them
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)
    assert bench.cpu_list(text) == cpus


def test_the_load_generator_times_the_refusals() -> None:
    # A burst refused in full: the report says how long the 429s took, not only how many.
    with _refusing() as url:
        report = loadgen.main(
            ["--url", url, "--requests", "12", "--concurrency", "4", "--warmup", "0", "--quiet"]
        )
    assert report.errors_by_status == {"429": 12}
    assert report.refused_p99_s is not None
    assert 0 < report.refused_p99_s < 10


_SPIN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


def test_cpu_time_counts_a_service_s_processes_by_role() -> None:
    # An engine that started a helper of its own, and a niced worker (the preparation's way):
    # each spins 0.3 s of CPU once told, then waits; the phase counts each where it belongs.
    # The helper waits for the engine's word, so that none of its spinning precedes the phase.
    # Both stay until the test closes the engine's input (an ended process is not counted).
    # The engine and its helper share one pipe: each says so in one write (atomic on a pipe),
    # where print's text and line end could be written apart and interleave.
    said = "import os\nos.write(1, b'spun\\n')\n"
    helper = "import sys\nsys.stdin.readline()\n" + _SPIN + said
    helper += "sys.stdin.read()\n"
    engine_code = (
        "import subprocess, sys\n"
        f"helper = subprocess.Popen([sys.executable, '-c', {helper!r}], stdin=subprocess.PIPE)\n"
        "sys.stdin.readline()\nhelper.stdin.write(b'go\\n')\nhelper.stdin.flush()\n"
        + _SPIN
        + said
        + "sys.stdin.read()\nhelper.stdin.close()\nhelper.wait()\n"
    )
    worker_code = "import sys\nsys.stdin.readline()\n" + _SPIN + "print('spun', flush=True)\n"
    engine, worker = _spawn(engine_code, niced=False), _spawn(worker_code, niced=True)
    try:
        with cpu_time.Phase(os.getpid(), engine.pid) as phase:
            for process in (engine, worker):
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            # Two lines from the engine's pipe (its helper shares it), one from the worker's.
            assert engine.stdout is not None
            assert worker.stdout is not None
            assert [engine.stdout.readline() for _ in range(2)] == ["spun\n"] * 2
            assert worker.stdout.readline() == "spun\n"
    finally:
        for process in (engine, worker):
            with process:  # closes its pipes once it has ended
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(timeout=10)
    assert phase.spent["engine"] >= 0.5  # its own 0.3 s and its helper's
    assert 0.25 <= phase.spent["preparation"] < 0.5
    assert phase.spent["wall_s"] > 0


def _spawn(code: str, niced: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.nice(5)) if niced else None,
    )


def test_counting_reports_each_process_s_counts_into_the_shared_file() -> None:
    report = counting.run("file", processes=2, seconds=0.3, gap_ms=1.0)
    assert len(report.by_process) == 2
    for process in report.by_process:
        assert process.counts > 0
        assert 0 < process.wall_ms_p50 <= process.wall_ms_p99 <= process.wall_ms_max
        assert process.cpu_us_per_count > 0


async def test_the_doorway_measurement_reports_the_cpu_of_each_kind_of_connection() -> None:
    figures = await asyncio.wait_for(doorway.measure(200), timeout=60)  # its admitted let go
    assert figures["connections"] == 200
    for kind in ("refusal_us", "admitted_us", "admission_refusal_us", "canned_us"):
        assert figures[kind] > 0
