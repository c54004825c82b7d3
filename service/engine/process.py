"""The engine process: the model, its scheduler and the generation loop, away from HTTP.

``run_engine`` is the target the API process starts with multiprocessing spawn. It binds the
requests socket, connects to the API process's results socket, reports ``Stats`` (its heartbeat)
from the first moment, loads the engine on its worker thread, sends ``Ready`` with the tokenizer
the API process needs, then serves ``Submit`` and ``Cancel`` until ``Shutdown`` (or until the
API process is gone: an orphaned engine exits by itself rather than holding the GPU).

Every request is one asyncio task awaiting the scheduler; its answer (``Finished`` or
``Failed``) is sent the moment it is known. A cancelled task sends nothing: the API process
already answered its client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import zmq
import zmq.asyncio

from service.collector import tune_collector
from service.engine.config import EngineConfig
from service.engine.protocol import (
    Cancel,
    Failed,
    Finished,
    FromEngine,
    LoadFailed,
    Ready,
    Shutdown,
    Stats,
    Submit,
    encoder,
    engine_decoder,
)
from service.engine.types import AnyEngine, ContinuousEngine, EngineLoader, GenerationRequest
from service.engine.worker import EngineWorker
from service.errors import GenerationFailed, ServiceError
from service.logs import configure_logging
from service.scheduling.continuous import ContinuousScheduler
from service.scheduling.microbatch import MicroBatchScheduler
from service.scheduling.types import GenerationScheduler

log = logging.getLogger("service.engine")

# Under CPU contention (a CPU-only host, or a busy GPU host) the API process goes first: probes
# and refusals must not wait behind the generation loop. Without contention this costs nothing.
_NICENESS = 5


def run_engine(
    config: EngineConfig, loader: EngineLoader, requests_address: str, results_address: str
) -> None:
    """Entry point of the engine process."""
    configure_logging(config.log_level, process="engine")
    _route_transformers_logs()
    # Ctrl-C reaches the whole process group; the API process decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(_NICENESS)
    asyncio.run(EngineHost(config, loader, requests_address, results_address).serve())


class EngineHost:
    """Owns the engine process's sockets, engine, scheduler and request tasks."""

    def __init__(
        self,
        config: EngineConfig,
        loader: EngineLoader,
        requests_address: str,
        results_address: str,
    ) -> None:
        self._config = config
        self._loader = loader
        self._addresses = (requests_address, results_address)
        self._encoder = encoder()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._engine: AnyEngine | None = None
        self._scheduler: GenerationScheduler | None = None
        self._answered = 0
        self._generated = 0
        self._parent = os.getppid()
        self._context = zmq.asyncio.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._outbox = self._context.socket(zmq.PUSH)
        for socket in (self._inbox, self._outbox):  # admission bounds what is in flight
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)

    async def serve(self) -> None:
        requests_address, results_address = self._addresses
        self._inbox.bind(requests_address)
        self._outbox.connect(results_address)
        reporter = asyncio.create_task(self._report(), name="engine-stats")
        worker = EngineWorker(lambda: self._loader(self._config))
        try:
            if await self._start(worker):
                await self._receive()
        finally:
            reporter.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(reporter, *self._tasks.values(), return_exceptions=True)
            if self._scheduler is not None:
                await self._scheduler.close(0)
            await worker.close()
            self._inbox.close(linger=0)
            self._outbox.close(linger=1000)
            self._context.term()

    async def _start(self, worker: EngineWorker) -> bool:
        try:
            self._engine = engine = await worker.start()
            kind = "continuous" if isinstance(engine, ContinuousEngine) else "static"
            scheduler: GenerationScheduler
            if isinstance(engine, ContinuousEngine):
                scheduler = ContinuousScheduler(engine)
            else:
                scheduler = MicroBatchScheduler(worker, self._config.batching)
            scheduler.start()
            self._scheduler = scheduler
        except Exception as error:
            log.exception("engine failed to load")
            await self._send(LoadFailed(message=f"{type(error).__name__}: {error}"))
            return False
        await self._send(
            Ready(
                info=engine.info,
                tokenizer=engine.tokenizer,
                kind=kind,
                capacity=scheduler.capacity,
            )
        )
        log.info("engine ready", extra={"engine": kind, "capacity": scheduler.capacity})
        # Collector pauses would stall every request's generation at once.
        tune_collector()
        return True

    async def _receive(self) -> None:
        decoder = engine_decoder()
        while True:
            message = decoder.decode(await self._inbox.recv())
            if isinstance(message, Submit):
                self._tasks[message.id] = asyncio.create_task(self._generate(message))
            elif isinstance(message, Cancel):
                task = self._tasks.get(message.id)
                if task is not None:
                    task.cancel()
            elif isinstance(message, Shutdown):
                return

    async def _generate(self, message: Submit) -> None:
        assert self._scheduler is not None
        request = GenerationRequest(
            prompt_ids=tuple(message.prompt_ids),
            max_new_tokens=message.max_new_tokens,
            decoding=message.decoding,
        )
        deadline = None if message.timeout_s is None else time.monotonic() + message.timeout_s
        answer: Finished | Failed
        try:
            scheduled = await self._scheduler.submit(request, deadline)
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
            self._tasks.pop(message.id, None)
            self._answered += 1
        await self._send(answer)

    async def _report(self) -> None:
        """The heartbeat: load figures every interval, from before the model is loaded."""
        while True:
            if os.getppid() != self._parent:
                log.error("the API process is gone; the engine stops")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            engine, scheduler = self._engine, self._scheduler
            await self._send(
                Stats(
                    in_flight=len(self._tasks),
                    running=scheduler.running if scheduler is not None else 0,
                    answered=self._answered,
                    generated_tokens=self._generated,
                    memory=engine.memory_bytes() if engine is not None else {},
                )
            )
            await asyncio.sleep(self._config.stats_interval_s)

    async def _send(self, message: FromEngine) -> None:
        await self._outbox.send(self._encoder.encode(message), copy=False)


def _route_transformers_logs() -> None:
    """transformers logs through its own stderr handler and draws tqdm bars; route its records
    into ours instead (the engine logs its own load stages with times)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.disable_progress_bar()
