"""``FastEngine``: the step loop of the fast engine behind the continuous-engine contract.

One thread owns the device. Each turn of its loop it takes what was submitted or cancelled, runs
one prefill step (whole prompts, or a chunk of a long one, up to ``prefill_tokens`` tokens, so a
long prompt never stalls the running decodes for more than a chunk) and one decode step for every
running row (a captured CUDA graph per batch-size bucket on CUDA). After a decode step the host
reads one token per row and does vectorised bookkeeping; per request it works only when the
request joins, needs a page, streams, or finishes.

KV-cache pages are committed at admission for the prompt and the whole token budget, so an
admitted request always completes; a request waits in the engine while the cache or the rows are
full. Results and streamed text go back to the event loop that submitted them.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch._inductor.config

from service.config.engine import EngineConfig, EngineSettings
from service.contract.errors import (
    EngineUnavailable,
    GenerationFailed,
    InvalidInput,
    OutOfMemory,
    ServiceError,
)
from service.contract.types import (
    Completion,
    Decoding,
    GenerationRequest,
    GenerationResult,
    TextSink,
)
from service.engine.fast.attention import (
    DecodeAttention,
    FlexDecode,
    GatherDecode,
    SmallBatchDecode,
    TritonDecode,
)
from service.engine.fast.batch import DeviceRows, HostRows, Joining
from service.engine.fast.cache import (
    CacheShape,
    PagedKVCache,
    fit_rows_and_pages,
    pages_for,
)
from service.engine.fast.checkpoint import Fp8Checkpoint
from service.engine.fast.compile_cache import use_compile_cache
from service.engine.fast.forward import Transformer, passes_norm_sums
from service.engine.fast.graphs import DecodeGraphs, buckets_up_to
from service.engine.fast.plan import (
    Plan,
    fold_norms_for,
    fused_rope_for,
    one_row_pdl_for,
    pdl_ready,
    plan_for,
)
from service.engine.fast.prefill import Piece, pack
from service.engine.fast.sampler import RowSampling, needs_full_sort, race_noise, sample
from service.engine.fast.weights import Geometry, is_dense, take_weights
from service.engine.generation import LoadedEngine
from service.engine.loading import LoadedModel

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Sequence:
    request_id: str
    prompt: tuple[int, ...]
    max_new: int
    decoding: Decoding
    on_done: Completion
    on_text: TextSink | None
    loop: asyncio.AbstractEventLoop
    submitted: float
    started: float = 0.0
    pages: list[int] = field(default_factory=list)
    committed: int = 0
    prefilled: int = 0
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _Launched:
    """A decode step on its way: its row count and where its tokens arrive on the host."""

    rows: int
    tokens: torch.Tensor
    ready: torch.cuda.Event | None


class FastEngine(LoadedEngine):
    """Implements ``Engine`` with the project's own paged, graph-captured decode."""

    kind = "fast"

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        super().__init__(loaded)
        fast = config.fast
        device = loaded.device
        moe = not is_dense(loaded.model)
        rows, prefill, graphs, compiled, attention_kind = plan_for(fast, device, loaded.dtype, moe)
        if compiled:
            use_compile_cache(config.model.data_dir)
            # Compiled kernels round to the model's dtype where the eager code does (inductor
            # otherwise keeps float32 between fused operations): closer to transformers in bf16.
            if hasattr(torch._inductor.config, "emulate_precision_casts"):
                torch._inductor.config.emulate_precision_casts = True
        fp8 = None if loaded.fp8_checkpoint is None else Fp8Checkpoint.open(loaded.fp8_checkpoint)
        fused_rope = fused_rope_for(fast.fused_rope, loaded.dtype, device)
        ready = pdl_ready(fast.pdl, graphs, device, fused_rope, attention_kind)
        fold = fold_norms_for(fast.fold_norms, loaded, moe, fp8, ready)
        self._weights = take_weights(loaded.model, config.model.quantization, fp8, fold_norms=fold)
        geometry = self._weights.geometry
        layers = len(self._weights.layers)
        page_size = fast.page_size
        if fast.num_pages:
            pages = fast.num_pages
        else:
            rows, pages = fit_rows_and_pages(
                geometry,
                layers,
                page_size,
                loaded.dtype,
                device,
                fast.memory_fraction,
                rows,
                prefill,
                rows_given=fast.max_rows is not None,
            )
        self._cache = PagedKVCache(
            geometry, layers, CacheShape(pages, page_size), loaded.dtype, device
        )
        max_pages = pages_for(geometry.max_positions, page_size)
        self._rows = DeviceRows(rows, max_pages, geometry.vocab, device)
        attention = self._attention(attention_kind, geometry, compiled, fast)
        scope = fast.compile_scope if compiled else None
        static = fast.decode_shapes == "static"
        pdl = one_row_pdl_for(fast.pdl, ready and passes_norm_sums(self._weights, device))
        self._model = Transformer(
            self._weights,
            self._cache,
            self._rows,
            attention,
            scope,
            static_decode=static,
            fused_rope=fused_rope,
            one_row_pdl=pdl,
        )
        self._choose: Callable[[torch.Tensor, torch.Tensor, int, bool], None] = (
            torch.compile(self._choose_tokens, fullgraph=True, dynamic=False if static else None)
            if compiled
            else self._choose_tokens
        )
        self._device = device
        self._max_rows = rows
        self._prefill_tokens = prefill
        self._page = page_size
        self._max_pages = max_pages
        self._max_positions = geometry.max_positions
        self._eos = np.array(sorted(self._eos_ids), dtype=np.int64)
        self._host: HostRows[_Sequence] = HostRows(rows, config.max_new_tokens)
        self._n = 0
        self._inbox: collections.deque[_Sequence] = collections.deque()
        self._cancels: collections.deque[str] = collections.deque()
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._prefilling: collections.deque[_Sequence] = collections.deque()
        self._by_id: dict[str, _Sequence] = {}
        self._wake = threading.Event()
        self._stopping = False
        # Model steps taken (prefill or decode): the supervisor's measure of progress.
        self._steps = 0
        self._cancelled_rows = False
        self._inflight: _Launched | None = None
        # Two host buffers: a step's tokens arrive in one while the next step fills the other.
        pinned = device.type == "cuda"
        self._host_tokens = [
            torch.zeros(rows, dtype=torch.long, pin_memory=pinned) for _ in range(2)
        ]
        self._flip = 0
        self._graphs: DecodeGraphs | None = None
        buckets = buckets_up_to(rows)
        # Static decode shapes compile each decode function once per bucket, and the layer
        # once per bucket and kind of layer (a mixture of experts after a dense first layer):
        # more than dynamo's default of 8 recompiles, past which a fullgraph compile fails.
        # Every bucket compiles here, before ready; serving runs only these sizes.
        kinds = len({layer.moe is None for layer in self._weights.layers})
        extra = len(buckets) * kinds if static else 0
        limit = torch._dynamo.config.recompile_limit + extra
        started = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=limit):
            if graphs:
                self._graphs = DecodeGraphs(self._decode_and_sample, buckets, device)
            elif compiled:
                # Under inference mode, as the step loop runs them: dynamo guards on grad mode,
                # so a warm-up outside it would compile every bucket again while serving (past
                # the limit above, which only holds here: every request would fail).
                with torch.inference_mode():
                    for bucket in reversed(buckets):
                        self._decode_and_sample(bucket, False)
        if graphs or compiled:
            log.info(
                "decode graphs captured" if graphs else "decode compiled",
                extra={
                    "buckets": len(buckets),
                    "seconds": round(time.perf_counter() - started, 3),
                    "decode_shapes": fast.decode_shapes,
                    **({"graphs": self._graphs.count} if self._graphs is not None else {}),
                },
            )
        if compiled:
            # The prefill's compiled parts, before ready: for one token (sizes 0 and 1 are
            # always specialised) and two other counts, the second of which makes the count
            # dynamic, so no prompt length compiles while requests wait.
            for tokens in (1, 16, 17):
                self.teacher_forced_logits(tuple(range(tokens)))
        self.plan = Plan(
            rows=rows,
            page_size=page_size,
            pages=pages,
            prefill_tokens=prefill,
            attention=attention.name,
            cuda_graphs=graphs,
            compiled=compiled,
            buckets=buckets,
            decode_shapes=fast.decode_shapes if compiled else "eager",
            fused_rope=fused_rope,
            one_row_pdl=pdl,
        )
        self._buckets = buckets
        self._static = static and compiled
        label = (
            "fp8"
            if fp8 is not None or config.model.quantization == "fp8"
            else self._info.quantization
        )
        self._info = dataclasses.replace(
            self._info,
            quantization=label,
            weights_bytes=self._weights.nbytes(),
            attention=attention.name,
        )
        log.info("fast engine ready", extra=dataclasses.asdict(self.plan))
        self._thread = threading.Thread(target=self._loop, name="fast-engine", daemon=True)
        self._thread.start()

    def _attention(
        self, kind: str, geometry: Geometry, compiled: bool, fast: EngineSettings
    ) -> DecodeAttention:
        if kind == "gather":
            return GatherDecode(self._cache, self._rows)
        flex = FlexDecode(self._cache, self._rows, compiled)
        if kind == "flex":
            return flex
        small = min(fast.triton_attention_rows, self._rows.rows)
        return SmallBatchDecode(TritonDecode(self._cache, self._rows, geometry, small), flex)

    # --- the contract, called on the event loop ------------------------------------------

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
    ) -> None:
        if not self.is_alive():
            raise EngineUnavailable("the generation thread is not running")
        sequence = _Sequence(
            request_id=request_id,
            prompt=tuple(request.prompt_ids),
            max_new=max(1, min(request.max_new_tokens, self._host.generated.shape[1] - 1)),
            decoding=request.decoding,
            on_done=on_done,
            on_text=on_text,
            loop=asyncio.get_running_loop(),
            submitted=time.monotonic(),
        )
        self._inbox.append(sequence)
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self._cancels.append(request_id)
        self._wake.set()

    def capacity(self) -> int | None:
        return self._max_rows

    def memory_bytes(self) -> dict[str, int]:
        """The device's memory by kind, and the KV cache's pool and its committed part (read
        from the engine thread's counters without a lock: a gauge may lag a step)."""
        memory = super().memory_bytes()
        if memory:
            cache = self._cache
            page = cache.page_bytes
            memory["kv_cache"] = cache.usable_pages * page
            memory["kv_cache_committed"] = cache.committed_pages * page
        return memory

    def running(self) -> int | None:
        return self._n + len(self._prefilling)

    def steps(self) -> int | None:
        return self._steps

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)

    def teacher_forced_logits(self, ids: tuple[int, ...]) -> torch.Tensor:
        """Float32 logits ``[len(ids), vocab]`` of every position of ``ids`` through the prefill
        path, for fidelity checks; call only while the engine is idle (it uses the cache)."""
        taken = [self._cache.take() for _ in range(pages_for(len(ids), self._page))]
        try:
            packed = pack([Piece(ids, taken, 0, len(ids))], self._page, self._device)
            every = torch.arange(len(ids), device=self._device)
            with torch.inference_mode():
                return self._model.prefill(dataclasses.replace(packed, last=every))
        finally:
            self._cache.release(taken, 0)

    # --- the step loop, on the engine thread ----------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            self._intake()
            if not (self._waiting or self._prefilling or self._n or self._inflight):
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                with torch.inference_mode():
                    self._prefill_step()
                    if self._n or self._inflight:
                        self._decode_step()
                self._steps += 1
            except Exception as error:
                log.exception("fast engine step failed")
                self._fail_all(error)

    def _intake(self) -> None:
        while self._inbox:
            sequence = self._inbox.popleft()
            refusal = self._refusal(sequence)
            if refusal is not None:
                self._reply(sequence, refusal)
                continue
            self._by_id[sequence.request_id] = sequence
            self._waiting.append(sequence)
        cancelled: set[str] = set()
        while self._cancels:
            request_id = self._cancels.popleft()
            held = self._by_id.get(request_id)
            if held is not None:
                held.cancelled = True
                cancelled.add(request_id)
                self._cancelled_rows = True
        if cancelled:
            # Waiting requests hold nothing: drop them now. Running ones leave at the next step.
            kept = [s for s in self._waiting if s.request_id not in cancelled]
            for sequence in self._waiting:
                if sequence.request_id in cancelled:
                    self._by_id.pop(sequence.request_id, None)
            self._waiting = collections.deque(kept)

    def _refusal(self, sequence: _Sequence) -> ServiceError | None:
        if not sequence.prompt:
            return InvalidInput("an empty prompt")
        total = len(sequence.prompt) + sequence.max_new
        if total > self._max_positions:
            return InvalidInput(
                f"prompt and output of {total} tokens exceed the model's "
                f"{self._max_positions} positions"
            )
        if pages_for(total, self._page) > self._cache.usable_pages:
            return OutOfMemory("the request needs more KV cache than this engine holds")
        return None

    def _prefill_step(self) -> None:
        budget = self._prefill_tokens
        chunk: list[tuple[_Sequence, int, int]] = []
        completing = 0  # prompts of this chunk that take a row when it ends
        while budget > 0:
            if self._prefilling and (not chunk or chunk[-1][0] is not self._prefilling[0]):
                sequence = self._prefilling[0]
            elif self._waiting and self._admit(self._waiting[0], completing):
                sequence = self._waiting.popleft()
                self._prefilling.append(sequence)
            else:
                break
            start = sequence.prefilled
            count = min(budget, len(sequence.prompt) - start)
            chunk.append((sequence, start, count))
            budget -= count
            if start + count < len(sequence.prompt):
                break
            self._prefilling.popleft()
            completing += 1
        if chunk:
            self._run_prefill(chunk)

    def _admit(self, sequence: _Sequence, completing: int) -> bool:
        if self._n + len(self._prefilling) + completing >= self._max_rows:
            return False
        need = pages_for(len(sequence.prompt) + sequence.max_new, self._page)
        if not self._cache.can_commit(need):
            return False
        self._cache.commit(need)
        sequence.committed = need
        sequence.started = time.monotonic()
        return True

    def _run_prefill(self, chunk: list[tuple[_Sequence, int, int]]) -> None:
        pieces = []
        for sequence, start, count in chunk:
            while len(sequence.pages) < pages_for(start + count, self._page):
                sequence.pages.append(self._cache.take())
            sequence.prefilled = start + count
            pieces.append(Piece(sequence.prompt, sequence.pages, start, count))
        logits = self._model.prefill(pack(pieces, self._page, self._device))
        finishing = [
            sequence
            for (sequence, _, _), piece in zip(chunk, pieces, strict=True)
            if piece.completes
        ]
        if finishing:
            self._first_tokens(finishing, logits)

    def _first_tokens(self, finishing: list[_Sequence], logits: torch.Tensor) -> None:
        """Sample each finished prompt's first token and move it into the decode batch."""
        vocab = self._weights.geometry.vocab
        device = self._device
        params = [_sampling_values(s.decoding) for s in finishing]
        seen = torch.zeros(len(finishing), vocab, dtype=torch.bool, device=device)
        for i, sequence in enumerate(finishing):
            seen[i, torch.as_tensor(sequence.prompt, device=device)] = True
        rows = RowSampling(
            greedy=torch.tensor([p[0] for p in params], device=device),
            temperature=torch.tensor([p[1] for p in params], device=device),
            top_k=torch.tensor([p[2] for p in params], device=device),
            top_p=torch.tensor([p[3] for p in params], device=device),
            penalty=torch.tensor([p[4] for p in params], device=device),
            seen=seen,
        )
        full = any(needs_full_sort(p[0], p[2]) for p in params)
        firsts = sample(logits, rows, full).tolist()
        joining: list[Joining] = []
        owners: tuple[list[int], list[int], list[int]] = ([], [], [])
        for sequence, token, values in zip(finishing, firsts, params, strict=True):
            if sequence.cancelled:
                self._release(sequence)
                continue
            if token in self._eos_ids or sequence.max_new == 1:
                self._finish_now(sequence, [token])
                continue
            row = self._n
            self._n += 1
            self._host.join(
                row,
                sequence,
                position=len(sequence.prompt),
                first_token=token,
                budget=sequence.max_new,
                streams=sequence.on_text is not None,
                full_sort=needs_full_sort(values[0], values[2]),
            )
            greedy, temperature, top_k, top_p, penalty = values
            joining.append(
                Joining(
                    row=row,
                    token=token,
                    position=len(sequence.prompt),
                    pages=list(sequence.pages),
                    greedy=greedy,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    penalty=penalty,
                    seen=[*sequence.prompt, token],
                )
            )
            owners[0].extend(sequence.pages)
            owners[1].extend([row] * len(sequence.pages))
            owners[2].extend(range(len(sequence.pages)))
            if sequence.on_text is not None:
                self._stream(sequence, [token])
        self._rows.activate(joining)
        self._cache.assign(*owners)

    def _decode_step(self) -> None:
        """Launch the next decode step, then read the previous one while the GPU runs it.

        A step's tokens are read one turn later, so the host's bookkeeping overlaps the next
        step instead of leaving the GPU idle. The next step is launched before the host knows
        which rows the previous one finished: when some did, their tokens of the next step are
        dropped (it was read at once, and nothing else is launched before the rows are packed).
        One speculative token stays inside a request's committed pages (its budget's last
        position is never written by the step that produces the last token).
        """
        launched = self._launch() if self._n else None
        previous, self._inflight = self._inflight, launched
        if previous is None:
            return
        finished = self._collect(previous, ())
        if finished:
            if launched is not None:
                finished |= self._collect(launched, sorted(finished))
                self._inflight = None
            self._finish_rows(sorted(finished))

    def _launch(self) -> _Launched:
        """Give the rows the pages their next position needs and start one decode step."""
        n, page, host = self._n, self._page, self._host
        growing = np.nonzero(host.length[:n] % page == 0)[0]
        if growing.size:
            rows, columns, pages = [], [], []
            for row in growing.tolist():
                sequence = host.held(row)
                taken = self._cache.take()
                columns.append(len(sequence.pages))
                sequence.pages.append(taken)
                rows.append(row)
                pages.append(taken)
            self._rows.set_pages(rows, columns, pages)
            self._cache.assign(pages, rows, columns)
        bucket = self._buckets[bisect.bisect_left(self._buckets, n)]
        full = bool(host.full_sort[:n].any())
        if self._graphs is not None:
            self._graphs.replay(bucket, full)
        elif self._static:
            # Compiled for the buckets' shapes only: run the step a graph would run.
            self._decode_and_sample(bucket, full)
        else:
            most = int(host.length[:n].max()) + 1
            self._decode_and_sample(n, full, pages_for(most, page))
        buffer = self._host_tokens[self._flip]
        self._flip ^= 1
        buffer[:n].copy_(self._rows.sampled[:n], non_blocking=True)
        ready = None
        if self._device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        host.length[:n] += 1
        return _Launched(rows=n, tokens=buffer, ready=ready)

    def _collect(self, step: _Launched, skip: list[int] | tuple[()]) -> set[int]:
        """Take a launched step's tokens into its rows (``skip``: rows already finished);
        returns the rows it finished."""
        if step.ready is not None:
            step.ready.synchronize()
        n, host = step.rows, self._host
        tokens = step.tokens[:n].numpy()
        live = np.ones(n, dtype=bool)
        live[list(skip)] = False
        rows_now = np.nonzero(live)[0]
        host.generated[rows_now, host.count[rows_now]] = tokens[rows_now]
        host.count[rows_now] += 1
        done = (np.isin(tokens, self._eos) | (host.count[:n] >= host.budget[:n])) & live
        for row in np.nonzero(host.streams[:n] & live & ~done)[0].tolist():
            self._stream(host.held(row), host.tokens(row))
        finished = set(np.nonzero(done)[0].tolist())
        if self._cancelled_rows:
            # Rare: a scan of the rows only when a running request was cancelled.
            self._cancelled_rows = False
            finished.update(row for row in range(n) if _is_cancelled(host.owner[row]))
        return finished

    def _decode_and_sample(self, batch: int, full: bool, pages: int | None = None) -> None:
        """One decode step of the first ``batch`` rows, ending with the sampled tokens fed back:
        the work a graph captures (no host synchronisation)."""
        hidden = self._model.decode(batch, pages or self._max_pages)
        noise = race_noise(batch, self._weights.geometry.vocab, full, self._device)
        # The full sort's cumsum over the vocabulary fails inductor's codegen at one row
        # ("NYI TritonSplitDimKernel reductions", torch 2.11); that mode is rare: eager.
        choose = self._choose_tokens if full else self._choose
        choose(hidden, noise, batch, full)

    def _choose_tokens(
        self, hidden: torch.Tensor, noise: torch.Tensor, batch: int, full: bool
    ) -> None:
        """Logits, the sampler and the chosen tokens written back into the rows: compiled with
        the engine, some sixty small eager kernels become a few fused ones."""
        rows = self._rows
        tokens = sample(self._model.logits(hidden), rows.rows_of(batch), full, noise)
        rows.sampled[:batch] = tokens
        rows.tokens[:batch] = tokens
        rows.sampling.seen[:batch].scatter_(1, tokens[:, None], True)
        rows.positions[:batch] += rows.live[:batch]

    def _finish_rows(self, finished: list[int]) -> None:
        n, host = self._n, self._host
        outputs = [(host.held(row), host.tokens(row)) for row in finished]
        keep = n - len(finished)
        gone = set(finished)
        holes = [row for row in finished if row < keep]
        movers = [row for row in range(keep, n) if row not in gone]
        host.move(holes, movers)
        host.clear(keep, n)
        self._rows.compact(holes, movers, keep, n)
        self._n = keep
        owners: tuple[list[int], list[int], list[int]] = ([], [], [])
        for hole in holes:
            pages = host.held(hole).pages
            owners[0].extend(pages)
            owners[1].extend([hole] * len(pages))
            owners[2].extend(range(len(pages)))
        for sequence, generated in outputs:
            if sequence.cancelled:
                self._release(sequence)
            else:
                self._finish_now(sequence, generated)
        self._cache.assign(*owners)

    def _finish_now(self, sequence: _Sequence, generated: list[int]) -> None:
        (result,) = self._detokenizer.results([len(sequence.prompt)], [generated])
        self._release(sequence)
        self._reply(sequence, result)

    def _release(self, sequence: _Sequence) -> None:
        self._cache.clear_owner(sequence.pages)
        self._cache.release(sequence.pages, sequence.committed)
        sequence.pages = []
        sequence.committed = 0
        self._by_id.pop(sequence.request_id, None)

    def _reply(self, sequence: _Sequence, outcome: GenerationResult | ServiceError) -> None:
        now = time.monotonic()
        started = sequence.started or now
        queued, ran = max(0.0, started - sequence.submitted), max(0.0, now - started)
        sequence.loop.call_soon_threadsafe(sequence.on_done, outcome, queued, ran)

    def _stream(self, sequence: _Sequence, generated: list[int]) -> None:
        assert sequence.on_text is not None
        text = self._detokenizer.prefix(generated)
        sequence.loop.call_soon_threadsafe(sequence.on_text, text)

    def _fail_all(self, error: Exception) -> None:
        failure: ServiceError = (
            OutOfMemory("out of memory while generating")
            if isinstance(error, torch.OutOfMemoryError)
            else GenerationFailed("the model failed to generate")
        )
        # Every request the engine holds, wherever the step failed (rows, prefill, queue).
        everyone = list(self._by_id.values())
        self._inflight = None
        self._host.clear(0, self._max_rows)
        self._rows.compact([], [], 0, self._n)
        self._n = 0
        self._prefilling.clear()
        self._waiting.clear()
        for sequence in everyone:
            self._release(sequence)
            if not sequence.cancelled:
                self._reply(sequence, failure)


def _sampling_values(decoding: Decoding) -> tuple[bool, float, int, float, float]:
    """(greedy, temperature, top_k, top_p, repetition penalty) of one request."""
    if decoding.greedy:
        return True, 1.0, 1, 1.0, float(decoding.repetition_penalty)
    return (
        False,
        float(decoding.temperature),
        int(decoding.top_k),
        float(decoding.top_p),
        float(decoding.repetition_penalty),
    )


def _is_cancelled(sequence: _Sequence | None) -> bool:
    return sequence is not None and sequence.cancelled
