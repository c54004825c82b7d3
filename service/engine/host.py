"""The engine process: the model, its scheduler and the generation loop, away from HTTP.

``run_engine`` is the target the API process starts with multiprocessing spawn. It binds the
requests socket, connects to the API process's results socket, reports ``Stats`` (its heartbeat)
from the first moment, loads the engine on its worker thread, sends ``Ready`` with the tokenizer
the API process needs, then serves ``Submit`` and ``Cancel`` until ``Shutdown`` (or until the
API process is gone: an orphaned engine exits by itself rather than holding the GPU).

It can serve several API processes (``peers``, the one that started it first): each has its own
pair of sockets and its own request ids, gets the answers to its own requests, and every one gets
``Ready`` and ``Stats``. Only the first may stop the engine.

Every request is one asyncio task awaiting the scheduler; its answer (``Finished`` or
``Failed``) is sent the moment it is known. A cancelled task sends nothing: the API process
already answered its client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

import zmq
import zmq.asyncio

from service.collector import tune_collector
from service.config.engine import EngineConfig, EngineLoader
from service.contract.errors import GenerationFailed, ServiceError
from service.contract.protocol import (
    Cancel,
    Failed,
    Finished,
    FromEngine,
    Hello,
    LoadFailed,
    Partial,
    Peer,
    Ready,
    Shutdown,
    Stats,
    Submit,
    encoder,
    engine_decoder,
)
from service.contract.types import Engine, GenerationRequest, TextSink
from service.engine.factory import load_engine
from service.engine.requests import PendingRequests
from service.engine.worker import EngineWorker
from service.logs import configure_logging

log = logging.getLogger("service.engine")

# Under CPU contention (a CPU-only host, or a busy GPU host) the API process goes first: probes
# and refusals must not wait behind the generation loop. Without contention this costs nothing.
_NICENESS = 5


def run_engine(
    config: EngineConfig, peers: Sequence[Peer], loader: EngineLoader = load_engine
) -> None:
    """Entry point of the engine process (an ``EngineEntry``); ``peers[0]`` is the API process
    that started it; ``loader`` builds the engine (tests give fakes)."""
    configure_logging(config.log_level, process="engine")
    # Ctrl-C, and SIGTERM sent to the whole process group (systemd's default stop, kill --
    # -PGID, timeout), reach the engine too: the API process decides when it stops (after its
    # drain: a Shutdown message, else SIGKILL), so requests being drained still finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(_NICENESS)
    asyncio.run(EngineHost(config, loader, peers).serve())
    # Everything is closed and logged by now. The interpreter's own finalization would only
    # make Triton's bindings print reference-leak reports on stderr (lines that are not JSON,
    # in a log that is); the process ends here instead.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class EngineHost:
    """Owns the engine process's sockets, engine, scheduler and request tasks."""

    def __init__(self, config: EngineConfig, loader: EngineLoader, peers: Sequence[Peer]) -> None:
        self._config = config
        self._loader = loader
        self._peers = list(peers)
        self._encoder = encoder()
        # Request ids are the sending API process's own: a task is keyed by (peer, id).
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._engine: Engine | None = None
        self._scheduler: PendingRequests | None = None
        self._ready: Ready | None = None
        self._answered = 0
        self._generated = 0
        # The accelerator's seconds at the last report, and when (``busy_share``).
        self._device_at: tuple[float, float] | None = None
        self._parent = os.getppid()
        self._context = zmq.asyncio.Context()
        self._inboxes = [self._context.socket(zmq.PULL) for _ in self._peers]
        self._outboxes = [self._context.socket(zmq.PUSH) for _ in self._peers]
        for socket in (*self._inboxes, *self._outboxes):  # admission bounds what is in flight
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)

    async def serve(self) -> None:
        for (requests_address, results_address), inbox, outbox in zip(
            self._peers, self._inboxes, self._outboxes, strict=True
        ):
            inbox.bind(requests_address)
            outbox.connect(results_address)
        reporter = asyncio.create_task(self._report(), name="engine-stats")
        worker = EngineWorker(lambda: self._loader(self._config))
        receivers: list[asyncio.Task[None]] = []
        try:
            if await self._start(worker):
                receivers = [
                    asyncio.create_task(self._receive(peer), name=f"engine-inbox-{peer}")
                    for peer in range(1, len(self._peers))
                ]
                await self._receive(0)  # the API process that started the engine stops it
        finally:
            for task in [reporter, *receivers, *self._tasks.values()]:
                task.cancel()
            await asyncio.gather(
                reporter, *receivers, *self._tasks.values(), return_exceptions=True
            )
            if self._scheduler is not None:
                await self._scheduler.close(0)
            await worker.close()
            for inbox in self._inboxes:
                inbox.close(linger=0)
            for outbox in self._outboxes:
                outbox.close(linger=1000)
            self._context.term()

    async def _start(self, worker: EngineWorker) -> bool:
        try:
            self._engine = engine = await worker.start()
            kind = str(getattr(engine, "kind", "fast"))  # a test's fake may name itself
            self._scheduler = scheduler = PendingRequests(engine)
        except Exception as error:
            log.exception("engine failed to load")
            await self._send(LoadFailed(message=f"{type(error).__name__}: {error}"))
            return False
        self._ready = Ready(
            info=engine.info,
            tokenizer=engine.tokenizer,
            kind=kind,
            capacity=scheduler.capacity,
            incarnation=os.getpid(),
            step_seconds=engine.step_seconds(),
        )
        await self._send(self._ready)
        log.info("engine ready", extra={"engine": kind, "capacity": scheduler.capacity})
        # Collector pauses would stall every request's generation at once.
        tune_collector()
        return True

    async def _receive(self, peer: int) -> None:
        decoder = engine_decoder()
        inbox = self._inboxes[peer]
        while True:
            message = decoder.decode(await inbox.recv())
            if isinstance(message, Submit):
                if message.incarnation not in (0, os.getpid()):
                    continue  # sent to an engine before this one; its caller was answered
                key = (peer, message.id)
                self._tasks[key] = asyncio.create_task(self._generate(peer, message))
            elif isinstance(message, Cancel):
                task = self._tasks.get((peer, message.id))
                if task is not None:
                    task.cancel()
            elif isinstance(message, Hello) and self._ready is not None:
                await self._send(self._ready, peer)  # a follower started after the Ready
            elif isinstance(message, Shutdown) and peer == 0:
                return

    async def _generate(self, peer: int, message: Submit) -> None:
        assert self._scheduler is not None
        request = GenerationRequest(
            prompt_ids=tuple(message.prompt_ids),
            max_new_tokens=message.max_new_tokens,
            decoding=message.decoding,
        )
        answer: Finished | Failed
        try:
            on_text = self._streamer(peer, message.id) if message.stream else None
            scheduled = await self._scheduler.submit(request, message.deadline, on_text)
            self._generated += scheduled.result.completion_tokens
            answer = Finished(
                id=message.id,
                result=scheduled.result,
                queue_s=scheduled.queue_s,
                inference_s=scheduled.inference_s,
            )
        except asyncio.CancelledError:
            return
        except ServiceError as error:
            answer = Failed(id=message.id, code=error.code, message=error.message)
        except Exception:
            log.exception("generation failed")
            failure = GenerationFailed("the model failed to generate")
            answer = Failed(id=message.id, code=failure.code, message=failure.message)
        finally:
            self._tasks.pop((peer, message.id), None)
            self._answered += 1
        await self._send(answer, peer)

    async def _report(self) -> None:
        """The heartbeat: load figures every interval, from before the model is loaded."""
        while True:
            if os.getppid() != self._parent:
                log.error("the API process is gone; the engine stops")
                os._exit(1)  # nothing is left to answer (SIGTERM is ignored: see run_engine)
                return
            engine, scheduler = self._engine, self._scheduler
            steps = engine.steps() if engine is not None else None
            device = engine.device_seconds() if engine is not None else None
            now = time.monotonic()
            busy, self._device_at = busy_share(self._device_at, device, now)
            await self._send(
                Stats(
                    in_flight=len(self._tasks),
                    running=scheduler.running if scheduler is not None else 0,
                    answered=self._answered,
                    generated_tokens=self._generated,
                    memory=engine.memory_bytes() if engine is not None else {},
                    steps=steps or 0,
                    device_busy=busy,
                    device_seconds=device,
                    loop_seconds=engine.loop_seconds() if engine is not None else {},
                )
            )
            await asyncio.sleep(self._config.stats_interval_s)

    def _streamer(self, peer: int, request_id: int) -> TextSink:
        """Sends what a streamed request's text gained since the last time, at once (queued
        on the socket before the request's ``Finished``, which is sent after it)."""
        sent = ""
        outbox = self._outboxes[peer]

        def grow(text: str) -> None:
            nonlocal sent
            if len(text) > len(sent) and text.startswith(sent):
                delta, sent = text[len(sent) :], text
                payload = self._encoder.encode(Partial(id=request_id, text=delta))
                # No high-water mark: a non-blocking send is queued now, in order.
                outbox.send(payload, flags=zmq.NOBLOCK, copy=False)

        return grow

    async def _send(self, message: FromEngine, peer: int | None = None) -> None:
        """To the API process ``peer``; to every one when None (ready, stats, load failure)."""
        payload = self._encoder.encode(message)
        outboxes = self._outboxes if peer is None else [self._outboxes[peer]]
        for outbox in outboxes:
            await outbox.send(payload, copy=False)


def busy_share(
    before: tuple[float, float] | None, device_s: float | None, now: float
) -> tuple[float | None, tuple[float, float] | None]:
    """The share of the wall time from ``before`` (the accelerator's seconds credited so far,
    and the clock then) to ``now`` that the accelerator worked, given its seconds now (None
    without both readings or time between them), and what the next report starts from. At
    most 1: the device's times arrive a step late (an event is read once it has passed), so a
    report may see more than its own interval's work; what is over 1 is carried to the next
    report, so that the shares average to the device's own share (the mean of shares cut at 1
    undercounted it: docs/benchmarks.md, run 102)."""
    if device_s is None:
        return None, None
    if before is None:
        return None, (device_s, now)
    if now <= before[1]:
        return None, before
    elapsed = now - before[1]
    share = min(1.0, max(0.0, device_s - before[0]) / elapsed)
    return round(share, 3), (before[0] + share * elapsed, now)
