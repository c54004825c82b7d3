"""Per-text preparation off the API process: language detection, validation, tokenization,
and reading markup at its tags.

These are the only per-text CPU costs before generation (detection alone is milliseconds per
text), and they hold the GIL: run in threads of the API process they starve the event loop that
answers ``/health`` and refusals. ``Preparer`` runs them in worker processes (multiprocessing
spawn), each with its own ``PromptBuilder`` built from what the engine reported (tokenizer,
model fingerprint). The workers are started with the API process, while the engine loads: the
interpreter, the imports and the language detector (seconds) are ready by then, and
``configure`` only hands them the tokenizer (milliseconds).

The workers are reached over ZeroMQ, as the engine is: one ``ipc://`` PUSH socket per worker
(the API process picks the worker with the fewest jobs outstanding) and one PULL socket for
every answer, read by a task of the event loop. Each worker binds its own jobs socket and the
API process connects to it: a connecting PUSH queues messages from the moment it connects, so a
job sent right after the worker said it was ready cannot find the socket without a peer (a bound
PUSH refuses to send until the peer's connection has been registered). A ``ProcessPoolExecutor``
did the same with two Python threads of its own in the API process (pickling, result handling)
that took the GIL from the event loop on every call, and one dead worker broke the whole pool
for good. Here a worker that dies fails only its own jobs (503, retry) and is started again.

Jobs and answers are pickled: they are the translator's own objects (languages, prompts, cache
keys), between processes of one service, on sockets in a private directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import zmq
import zmq.asyncio

from service.contract.encoding import ChatPromptEncoder
from service.contract.errors import EngineUnavailable, ServiceError, error_of
from service.contract.tokenizer import TokenizerSpec
from service.contract.types import Decoding
from service.frontend.translation.detection import Detection, LanguageDetector
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.markup import Segmented, segment
from service.frontend.translation.prompt_builder import PromptBuilder
from service.frontend.translation.prompts import PLAIN, TranslationOptions
from service.frontend.translation.results import Prepared, TranslationConfig
from service.frontend.translation.segments import Document, split_document

log = logging.getLogger(__name__)

_READY = "ready"
_CONFIGURE = "configure"
_START_TIMEOUT_S = 120.0
_RESTART_DELAY_S = 1.0


def _serve(config: TranslationConfig, jobs_address: str, results_address: str, index: int) -> None:
    """Entry point of a preparation worker: answer jobs until the API process is gone. The first
    job is ``configure``, which gives it the engine's tokenizer."""
    # Ctrl-C, and SIGTERM sent to the whole process group (systemd's default stop), reach the
    # workers too: the API process decides when they stop (after its drain).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Preparation is throughput work; the API processes' event loops (refusals, probes) are
    # latency work. When a burst's admitted texts all arrive here at once, the kernel should
    # run the event loops first.
    os.nice(config.prepare_niceness)
    languages = LanguageTable()
    detector = LanguageDetector(languages)
    builder: PromptBuilder | None = None
    parent = os.getppid()
    context = zmq.Context()
    jobs = context.socket(zmq.PULL)
    results = context.socket(zmq.PUSH)
    for socket in (jobs, results):  # admission bounds what is in flight
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
    jobs.bind(jobs_address)
    results.connect(results_address)
    results.send(pickle.dumps((0, _READY, index)))
    try:
        while os.getppid() == parent:  # an orphaned worker exits by itself
            if not jobs.poll(1000):
                continue
            job_id, kind, args = pickle.loads(jobs.recv())
            if kind == _CONFIGURE:
                spec, fingerprint = args
                encoder = ChatPromptEncoder(spec)
                builder = PromptBuilder(
                    config, encoder, fingerprint, languages=languages, detector=detector
                )
                answer: tuple[str, object] = ("ok", None)
            elif builder is None:
                answer = ("crash", "the worker has no tokenizer yet")
            else:
                answer = _answer(builder, kind, args)
            results.send(pickle.dumps((job_id, *answer), protocol=5))
    finally:
        jobs.close(linger=0)
        results.close(linger=0)
        context.term()


def _answer(builder: PromptBuilder, kind: str, args: tuple[Any, ...]) -> tuple[str, object]:
    try:
        if kind == "prepare":
            texts, target, source, fields, options = args
            return "ok", [
                builder.prepare(text, target, source, field=field, options=options)
                for text, field in zip(texts, fields, strict=True)
            ]
        if kind == "split":
            text, max_chars, hard_chars = args
            return "ok", split_document(text, max_chars, hard_chars, builder.fits)
        if kind == "segment":
            documents, ignore, inline = args
            return "ok", [segment(document, ignore, inline) for document in documents]
        if kind == "render":
            text, target, source, options = args
            prepared = builder.prepare(text, target, source, field="text", options=options)
            return "ok", (prepared, builder.chat_text(prepared))
        if kind == "chat":
            content, decoding, max_new_tokens = args
            return "ok", builder.prepare_chat(content, decoding, max_new_tokens)
        (texts,) = args
        return "ok", [builder.detect(text) for text in texts]
    except ServiceError as error:
        return "error", (error.code, error.message, type(error).__name__)
    except Exception as error:
        log.exception("preparation failed")
        return "crash", f"{type(error).__name__}: {error}"


class _Worker:
    """One worker process, the socket that feeds it and the jobs it has not answered."""

    def __init__(self, index: int, socket: zmq.Socket[bytes], address: str) -> None:
        self.index = index
        self.socket = socket
        self.address = address
        self.process: multiprocessing.process.BaseProcess | None = None
        # Its process has started and said so; and it has the tokenizer (takes jobs).
        self.up = False
        self.ready = False
        # Resolved by the worker's ready message while it is being started.
        self.started: asyncio.Future[None] | None = None
        self.outstanding: set[int] = set()
        # When it last answered a job, or took one while holding none (the watchdog's clock).
        self.heard_at = time.monotonic()


class Preparer:
    """Prepares texts in worker processes (implements the translator's ``TextPreparer``)."""

    def __init__(self, config: TranslationConfig, workers: int) -> None:
        # The tokenizer and model fingerprint the workers prepare for; None until configured.
        self.fingerprint: str | None = None
        self._tokenizer: tuple[TokenizerSpec, str] | None = None
        self._config = config
        self._folder = tempfile.mkdtemp(prefix="hymt-prepare-")
        self._sync_context = zmq.Context()
        self._context = zmq.asyncio.Context()
        self._results = self._context.socket(zmq.PULL)
        self._results.setsockopt(zmq.RCVHWM, 0)
        self._results_address = f"ipc://{self._folder}/results"
        self._workers: list[_Worker] = []
        for index in range(workers):
            socket = self._sync_context.socket(zmq.PUSH)
            socket.setsockopt(zmq.SNDHWM, 0)
            self._workers.append(_Worker(index, socket, f"ipc://{self._folder}/jobs-{index}"))
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._receiver: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._restarts: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def pids(self) -> list[int | None]:
        """The workers' process ids: a restarted worker's once it is started, None before the
        first start."""
        return [w.process.pid if w.process is not None else None for w in self._workers]

    async def start(self) -> None:
        """Start every worker now (each loads the detector), not under load."""
        self._results.bind(self._results_address)
        for worker in self._workers:
            worker.socket.connect(worker.address)
        self._receiver = asyncio.create_task(self._receive(), name="preparation-results")
        self._watchdog = asyncio.create_task(self._watch(), name="preparation-watchdog")
        await asyncio.wait_for(
            asyncio.gather(*(self._spawn(worker) for worker in self._workers)),
            _START_TIMEOUT_S,
        )

    async def configure(self, spec: TokenizerSpec, fingerprint: str) -> None:
        """Give every worker the engine's tokenizer (again after a model change); workers take
        jobs from then on. A worker started later is configured as it starts."""
        self._tokenizer = (spec, fingerprint)
        self.fingerprint = fingerprint
        await asyncio.gather(*(self._configure(w) for w in self._workers if w.up))

    async def _configure(self, worker: _Worker) -> None:
        assert self._tokenizer is not None
        await self._send(worker, _CONFIGURE, self._tokenizer)
        worker.ready = True

    async def prepare(
        self,
        texts: Sequence[str],
        target: Language,
        source: Language | None,
        fields: Sequence[str],
        options: TranslationOptions = PLAIN,
    ) -> list[Prepared]:
        result: list[Prepared] = await self._run(
            "prepare", (list(texts), target, source, list(fields), options)
        )
        return result

    async def split(self, text: str, max_chars: int, hard_chars: int) -> Document:
        result: Document = await self._run("split", (text, max_chars, hard_chars))
        return result

    async def segment(
        self, documents: Sequence[str], ignore: Sequence[str], inline: Iterable[str]
    ) -> list[Segmented]:
        """HTML or XML documents split at their tags (``markup.segment``): linear, but a
        megabyte of markup is a second of CPU, which the event loop must not spend."""
        result: list[Segmented] = await self._run(
            "segment", (list(documents), list(ignore), frozenset(inline))
        )
        return result

    async def render(
        self, text: str, target: Language, source: Language | None, options: TranslationOptions
    ) -> tuple[Prepared, str]:
        result: tuple[Prepared, str] = await self._run("render", (text, target, source, options))
        return result

    async def prepare_chat(self, content: str, decoding: Decoding, max_new_tokens: int) -> Prepared:
        result: Prepared = await self._run("chat", (content, decoding, max_new_tokens))
        return result

    async def detect(self, texts: Sequence[str]) -> list[Detection]:
        result: list[Detection] = await self._run("detect", (list(texts),))
        return result

    def close(self) -> None:
        """Stop the workers; jobs still outstanding fail with a 503."""
        if self._closed:
            return
        self._closed = True
        for task in [self._receiver, self._watchdog, *self._restarts]:
            if task is not None:
                task.cancel()
        loop = asyncio.get_running_loop()
        for worker in self._workers:
            process = worker.process
            if process is not None:
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(process.sentinel)
                if process.is_alive():
                    process.kill()  # it ignores SIGTERM (above) and holds nothing to save
                process.join(2.0)
            worker.socket.close(linger=0)
        self._fail(list(self._pending), EngineUnavailable("the service is stopping"))
        self._results.close(linger=0)
        self._context.term()
        self._sync_context.term()
        shutil.rmtree(self._folder, ignore_errors=True)

    async def _run(self, kind: str, args: tuple[Any, ...]) -> Any:
        ready = [worker for worker in self._workers if worker.ready]
        if not ready or self._closed:
            raise EngineUnavailable("no text-preparation worker is running; retry shortly")
        return await self._send(min(ready, key=lambda w: len(w.outstanding)), kind, args)

    async def _send(self, worker: _Worker, kind: str, args: tuple[Any, ...]) -> Any:
        job_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[job_id] = future
        if not worker.outstanding:
            worker.heard_at = time.monotonic()  # idle until now: not silent until now
        worker.outstanding.add(job_id)
        try:
            # A connecting PUSH without a high-water mark queues: this never blocks.
            worker.socket.send(pickle.dumps((job_id, kind, args), protocol=5))
            return await future
        finally:
            # Answered, failed or abandoned (the caller left): either way no longer this job's.
            self._pending.pop(job_id, None)
            worker.outstanding.discard(job_id)

    async def _spawn(self, worker: _Worker) -> None:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        worker.started = started
        context = multiprocessing.get_context("spawn")
        process = context.Process(
            target=_serve,
            args=(self._config, worker.address, self._results_address, worker.index),
            name=f"hymt-prepare-{worker.index}",
            daemon=True,
        )
        # Spawning pickles the arguments and starts an interpreter: off the event loop.
        await asyncio.to_thread(process.start)
        worker.process = process
        asyncio.get_running_loop().add_reader(
            process.sentinel, functools.partial(self._exited, worker, process)
        )
        await started
        if self._tokenizer is not None:
            await self._configure(worker)

    async def _receive(self) -> None:
        while True:
            job_id, status, payload = pickle.loads(await self._results.recv())
            if status == _READY:
                worker = self._workers[payload]
                worker.up = True
                if worker.started is not None and not worker.started.done():
                    worker.started.set_result(None)
                continue
            for worker in self._workers:
                if job_id in worker.outstanding:
                    worker.heard_at = time.monotonic()
            future = self._pending.get(job_id)
            if future is None or future.done():
                continue  # its caller left, or its worker died and it was failed already
            if status == "ok":
                future.set_result(payload)
            elif status == "error":
                future.set_exception(error_of(*payload))
            else:
                log.error("text preparation failed", extra={"error": payload})
                future.set_exception(ServiceError("text preparation failed"))

    async def _watch(self) -> None:
        """A worker that holds jobs and has answered none for ``prepare_timeout_s`` is hung
        (stopped, or wedged by a text): killed, so that its exit fails its jobs (503, retry)
        and starts it again. A dead worker is noticed at once; a hung one kept its callers
        waiting for ever, and /health said ready."""
        limit = self._config.prepare_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for worker in self._workers:
                process = worker.process
                silent = now - worker.heard_at
                if worker.outstanding and silent > limit and process is not None:
                    if process.is_alive():
                        log.error(
                            "preparation worker hung; killing it",
                            extra={"pid": process.pid, "jobs": len(worker.outstanding)},
                        )
                        process.kill()  # its sentinel fires: ``_exited`` does the rest
                    worker.heard_at = now  # once per silence

    def _exited(self, worker: _Worker, process: multiprocessing.process.BaseProcess) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join(0.5)
        was_ready, worker.ready, worker.up = worker.ready, False, False
        self._fail(list(worker.outstanding), EngineUnavailable("a preparation worker stopped"))
        started = worker.started
        if started is not None and not started.done():
            started.set_exception(
                EngineUnavailable(
                    f"a preparation worker exited while starting ({process.exitcode})"
                )
            )
        if self._closed or not was_ready:
            return  # one that was starting is retried (or reported) by whoever started it
        log.error(
            "preparation worker exited; starting it again",
            extra={"pid": process.pid, "exitcode": process.exitcode},
        )
        task = asyncio.get_running_loop().create_task(self._keep_starting(worker))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _keep_starting(self, worker: _Worker) -> None:
        while not self._closed:
            try:
                await self._spawn(worker)
                return
            except (ServiceError, OSError) as error:
                log.error("preparation worker failed to start", extra={"error": str(error)})
                await asyncio.sleep(_RESTART_DELAY_S)

    def _fail(self, job_ids: list[int], error: ServiceError) -> None:
        for job_id in job_ids:
            future = self._pending.get(job_id)
            if future is not None and not future.done():
                future.set_exception(error)
