"""The fast engine's model runner: everything on the device.

It owns the weights, the KV cache's tensors, the decode rows' tensors, the model's forward, the
decode graphs (or the compiled or eager decode step) and sampling, and carries out what the
scheduler planned: a prefill of the chunks it chose (sampling the first token of each prompt
that completes), rows that join, pages that rows take, a decode step launched without waiting
for it (``launch``) and its tokens read back later (``collect``), rows packed down when others
finish. It decides nothing about which request runs.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch._inductor.config

from service.config.engine import EngineConfig, EngineSettings
from service.engine.capability import Capability
from service.engine.fast import quant_gemv, waits
from service.engine.fast.attention import (
    DecodeAttention,
    FlexDecode,
    GatherDecode,
    SmallBatchDecode,
    TritonDecode,
)
from service.engine.fast.attention_choice import (
    MEASURED_ABOVE,
    AttentionTimer,
    measured_triton_rows,
)
from service.engine.fast.batch import DeviceRows, Joining
from service.engine.fast.budget import Wanted, sized_cache
from service.engine.fast.cache import KV_FP8, allocator_gib
from service.engine.fast.checkpoint import Fp8Checkpoint
from service.engine.fast.compile_cache import use_compile_cache
from service.engine.fast.device_clock import DeviceClock
from service.engine.fast.forward import Transformer, passes_norm_sums
from service.engine.fast.graphs import DecodeGraphs, buckets_up_to
from service.engine.fast.pages import pages_for
from service.engine.fast.plan import (
    Plan,
    flex_in_graphs,
    fold_norms_for,
    fused_rope_for,
    kv_dtype_for,
    one_row_pdl_for,
    pdl_ready,
    plan_for,
    prefill_graph_tokens_for,
    prefill_warmups,
)
from service.engine.fast.prefill import Piece, layout, pack
from service.engine.fast.prefill_graphs import capture
from service.engine.fast.sampler import RowSampling, full_sort_rows, race_noise, sample_rows
from service.engine.fast.scheduler import Chunk, DecodePlan, Joined, PageOwners, Retired
from service.engine.fast.sequence import Sequence
from service.engine.fast.transfer import to_device
from service.engine.fast.weights import Geometry, ModelWeights, is_dense, take_weights
from service.engine.loading import LoadedModel

log = logging.getLogger(__name__)

# The context length a timed step reads where the kernels read only what is there (an eager
# step): a translation's prompt and output.
_TYPICAL_CONTEXT = 256
# A timed step is repeated only while it is this cheap.
_RETIME_BELOW_S = 0.05


@dataclass(frozen=True, slots=True)
class Launched:
    """A decode step on its way: its row count and where its tokens arrive on the host."""

    rows: int
    tokens: torch.Tensor
    ready: torch.cuda.Event | None


@dataclass(frozen=True, slots=True)
class Firsts:
    """A prefill's first tokens on their way to the host (``tokens`` None: no prompt
    completed)."""

    tokens: torch.Tensor | None
    ready: torch.cuda.Event | None


@dataclass(frozen=True, slots=True)
class _Choices:
    """What ``plan_for`` and the lone request's kernel choices settled on."""

    rows: int
    prefill: int
    graphs: bool
    compiled: bool
    attention: str
    fused_rope: bool
    pdl_ready: bool
    fp8: Fp8Checkpoint | None
    capability: Capability
    # The largest prefill step run as a CUDA graph (``plan.prefill_graph_tokens_for``) before
    # the chunk is fitted to the device: the fit sets its pool aside, the capture takes no more
    # than the fitted chunk.
    prefill_graph_tokens: int
    kv_dtype: torch.dtype


def _weights(loaded: LoadedModel, config: EngineConfig, choices: _Choices) -> ModelWeights:
    """The model's weights taken over in the engine's layout, norms folded where they fold."""
    fast = config.fast
    fold = fold_norms_for(
        fast.fold_norms, loaded, not is_dense(loaded.model), choices.fp8, choices.pdl_ready
    )
    return take_weights(
        loaded.model,
        config.model.quantization,
        choices.fp8,
        fold_norms=fold,
        fp8_fast_accum=fast.fp8_fast_accumulation,
        wide_four_bit=choices.capability.wide_four_bit,
    )


class ModelRunner:
    """The device side of the fast engine for ``loaded`` under ``config``."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        fast = config.fast
        self.device = loaded.device
        self.clock = DeviceClock(self.device)
        choices = _choose(loaded, config)
        self.weights: ModelWeights = _weights(loaded, config, choices)
        geometry = self.weights.geometry
        self.page_size = fast.page_size
        self._two_stage_rows = fast.topk_two_stage_rows
        wanted = Wanted(
            choices.rows, choices.prefill, choices.kv_dtype, choices.prefill_graph_tokens
        )
        fitted, self.cache = sized_cache(self.weights, loaded, fast, wanted)
        rows, pages, prefill = fitted.rows, fitted.pages, fitted.prefill_tokens
        self._max_pages = pages_for(geometry.max_positions, fast.page_size)
        self.rows = DeviceRows(rows, self._max_pages, geometry.vocab, self.device)
        self._buckets = buckets_up_to(rows)
        attention = self._attention(choices, geometry, fast)
        self._static = fast.decode_shapes == "static" and choices.compiled
        pdl = one_row_pdl_for(
            fast.pdl, choices.pdl_ready and passes_norm_sums(self.weights, self.device)
        )
        self.model = Transformer(
            self.weights,
            self.cache,
            self.rows,
            attention,
            fast.compile_scope if choices.compiled else None,
            static_decode=fast.decode_shapes == "static",
            fused_rope=choices.fused_rope,
            one_row_pdl=pdl,
            prefill_kernel=choices.capability.prefill_kernel(loaded.dtype),
        )
        self._choose_step: Callable[[torch.Tensor, torch.Tensor | None, int, bool], None] = (
            self._choose_tokens
        )
        if choices.compiled:
            static = fast.decode_shapes == "static"
            self._choose_step = torch.compile(
                self._choose_tokens, fullgraph=True, dynamic=False if static else None
            )
        # Two host buffers: a step's tokens arrive in one while the next step fills the other.
        self._pinned = self.device.type == "cuda"
        self._host_tokens = [
            torch.zeros(rows, dtype=torch.long, pin_memory=self._pinned) for _ in range(2)
        ]
        self._flip = 0
        self._graphs = self._prepare_decode(choices, fast)
        if choices.compiled:
            self._compile_prefill(prefill, pages)
        self._decoding = 0  # rows of the decode step launched last
        self._prefill_graph_rows = fast.prefill_graph_rows
        self._prefill_graphs = capture(
            self.model.prefill,
            min(choices.prefill_graph_tokens, prefill),
            self.device,
            fast.prefill_graph_tokens is not None,
        )
        self.plan = Plan(
            rows=rows,
            page_size=fast.page_size,
            pages=pages,
            prefill_tokens=prefill,
            attention=attention.name,
            cuda_graphs=choices.graphs,
            compiled=choices.compiled,
            buckets=self._buckets,
            decode_shapes=fast.decode_shapes if choices.compiled else "eager",
            fused_rope=choices.fused_rope,
            one_row_pdl=pdl,
            triton_rows=attention.small_rows if isinstance(attention, SmallBatchDecode) else 0,
            prefill_graph_tokens=self._prefill_graphs.largest if self._prefill_graphs else 0,
            kv_cache_dtype=str(choices.kv_dtype).removeprefix("torch."),
            workspace_gib=round(fitted.workspace / 2**30, 3),
        )
        self.attention = attention.name
        self.fp8 = choices.fp8 is not None

    def _attention(
        self, choices: _Choices, geometry: Geometry, fast: EngineSettings
    ) -> DecodeAttention:
        if choices.attention == "gather":
            return GatherDecode(self.cache, self.rows)
        flex = FlexDecode(self.cache, self.rows, choices.compiled)
        if choices.attention == "flex":
            return flex
        small = fast.triton_attention_rows
        # An 8-bit cache only the Triton kernel reads (``plan.kv_dtype_for``).
        if not flex_in_graphs(choices.graphs, choices.compiled) or self.cache.dtype == KV_FP8:
            small = self.rows.rows
        elif small is None:
            small = min(MEASURED_ABOVE, self.rows.rows)
            if self.device.type == "cuda":  # the kernels' speeds are a GPU's to measure
                widest = TritonDecode(self.cache, self.rows, geometry, self.rows.rows)
                timer = AttentionTimer(
                    self.cache, self.rows, geometry, widest, _TYPICAL_CONTEXT, choices.compiled
                )
                small = measured_triton_rows(timer, self._buckets)
        small = min(small, self.rows.rows)
        return SmallBatchDecode(TritonDecode(self.cache, self.rows, geometry, small), flex)

    def _prepare_decode(self, choices: _Choices, fast: EngineSettings) -> DecodeGraphs | None:
        """Capture the decode graphs, or compile the decode step for every bucket, before the
        engine reports ready: serving runs only these sizes."""
        if not (choices.graphs or choices.compiled):
            return None
        # Static decode shapes compile each decode function once per bucket, and the layer
        # once per bucket and kind of layer (a mixture of experts after a dense first layer):
        # more than dynamo's default of 8 recompiles, past which a fullgraph compile fails.
        kinds = len({layer.moe is None for layer in self.weights.layers})
        extra = len(self._buckets) * kinds if fast.decode_shapes == "static" else 0
        limit = torch._dynamo.config.recompile_limit + extra
        started = time.perf_counter()
        graphs = None
        with torch._dynamo.config.patch(recompile_limit=limit):
            if choices.graphs:
                graphs = DecodeGraphs(self._decode_and_sample, self._buckets, self.device)
            else:
                # Under inference mode, as the step loop runs them: dynamo guards on grad mode,
                # so a warm-up outside it would compile every bucket again while serving (past
                # the limit above, which only holds here: every request would fail).
                with torch.inference_mode():
                    for bucket in reversed(self._buckets):
                        self._decode_and_sample(bucket, False)
        log.info(
            "decode graphs captured" if graphs is not None else "decode compiled",
            extra={
                "buckets": len(self._buckets),
                "seconds": round(time.perf_counter() - started, 3),
                "decode_shapes": fast.decode_shapes,
                **({"graphs": graphs.count} if graphs is not None else {}),
                **allocator_gib(self.device),
            },
        )
        return graphs

    def _compile_prefill(self, chunk: int, pages: int) -> None:
        """The prefill's compiled parts, before ready: for one token (sizes 0 and 1 are always
        specialised) and two other counts, the second of which makes the count dynamic, so no
        prompt length compiles while requests wait; for bitsandbytes weights on a GPU, each
        branch of ``quant_gemv.branches`` a chunk can reach (``prefill_warmups``)."""
        qkv = self.weights.layers[0].qkv
        bounds: tuple[int, ...] = ()
        if qkv.bitsandbytes and quant_gemv.runs(self.weights.embed.dtype, self.device):
            bounds = quant_gemv.branches(qkv)
        for tokens in prefill_warmups(bounds, chunk, pages, self.page_size):
            scratch = list(range(1, 1 + pages_for(tokens, self.page_size)))
            piece = Piece(tuple(range(tokens)), scratch, 0, tokens)
            with torch.inference_mode():  # the last token's logits only, as a prefill's
                self.model.prefill(pack([piece], self.page_size, self.device))

    # --- prefill ---------------------------------------------------------------------------

    def prefill(self, chunks: list[Chunk]) -> Firsts:
        """Launch the prefill of ``chunks`` (their pages taken) and the choice of the first
        token of each prompt that completes; ``firsts`` reads them."""
        pieces = [
            Piece(c.sequence.prompt, c.sequence.pages, c.start, c.count, c.reuse) for c in chunks
        ]
        started = self.clock.start()
        step = layout(pieces, self.page_size)
        graphs = self._prefill_graphs
        if self._prefill_graph_rows is not None and self._decoding >= self._prefill_graph_rows:
            graphs = None
        bucket = graphs.bucket_for(step) if graphs is not None else None
        if graphs is not None and bucket is not None:
            logits = graphs.run(step, bucket)
        else:
            logits = self.model.prefill(step.packed(self.device))
        completing = [c.sequence for c in chunks if c.completes]
        if not completing:
            self.clock.stop(started)
            return Firsts(None, None)
        chosen = self._first_tokens(completing, logits)
        # Into page-locked memory, with an event after it: reading them waits for this
        # prefill only, not for the decode step launched after it.
        host = torch.empty(len(completing), dtype=torch.long, pin_memory=self._pinned)
        host.copy_(chosen, non_blocking=True)
        ready = None
        if self.device.type == "cuda":
            tokens = sum(c.count for c in chunks)
            ready = waits.ready_event(waits.sleeps_for_prefill(tokens, self._decoding))
        self.clock.stop(started)
        return Firsts(host, ready)

    @property
    def graph_prefills(self) -> int:
        """Prefill steps replayed as a captured graph so far."""
        return 0 if self._prefill_graphs is None else self._prefill_graphs.steps

    def firsts(self, pending: Firsts) -> list[int]:
        """The first tokens a prefill chose, in order (waits for that prefill)."""
        if pending.tokens is None:
            return []
        if pending.ready is not None:
            pending.ready.synchronize()
        tokens: list[int] = pending.tokens.tolist()
        return tokens

    def _first_tokens(self, sequences: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        device = self.device
        params = [s.parameters for s in sequences]
        # The prompts' tokens count as seen (the repetition penalty): one scatter for all.
        seen = torch.zeros(
            len(sequences), self.weights.geometry.vocab, dtype=torch.bool, device=device
        )
        owners = [i for i, sequence in enumerate(sequences) for _ in sequence.prompt]
        tokens_seen = [token for sequence in sequences for token in sequence.prompt]
        seen.index_put_(
            (to_device(owners, torch.long, device), to_device(tokens_seen, torch.long, device)),
            torch.ones((), dtype=torch.bool, device=device),
        )
        rows = RowSampling(
            greedy=to_device([p.greedy for p in params], torch.bool, device),
            temperature=to_device([p.temperature for p in params], torch.float32, device),
            top_k=to_device([p.top_k for p in params], torch.long, device),
            top_p=to_device([p.top_p for p in params], torch.float32, device),
            penalty=to_device([p.penalty for p in params], torch.float32, device),
            seen=seen,
        )
        full = any(p.full_sort for p in params)
        return sample_rows(logits, rows, full, at_once=full_sort_rows(self.rows.rows))

    def join(self, joined: Joined) -> None:
        """Write the rows of the requests that joined, and forget the pages of those that
        ended at their first token."""
        self.cache.clear_owner(joined.freed)
        self.rows.activate(
            [
                Joining(
                    row=row,
                    token=token,
                    position=len(sequence.prompt),
                    pages=list(sequence.pages),
                    greedy=sequence.parameters.greedy,
                    temperature=sequence.parameters.temperature,
                    top_k=sequence.parameters.top_k,
                    top_p=sequence.parameters.top_p,
                    penalty=sequence.parameters.penalty,
                    seen=[*sequence.prompt, token],
                )
                for row, sequence, token in joined.rows
            ]
        )
        self._own(joined.owners)

    def teacher_forced_logits(self, ids: tuple[int, ...], pages: list[int]) -> torch.Tensor:
        """Float32 logits ``[len(ids), vocab]`` of every position of ``ids`` through the prefill
        path, written into ``pages`` (free ones: call only while the engine is idle)."""
        packed = pack([Piece(ids, pages, 0, len(ids))], self.page_size, self.device)
        every = torch.arange(len(ids), device=self.device)
        with torch.inference_mode():
            return self.model.prefill(dataclasses.replace(packed, last=every))

    # --- decode ----------------------------------------------------------------------------

    def launch(self, plan: DecodePlan) -> Launched:
        """Give rows the pages they took and start one decode step; its tokens are read by
        ``collect``."""
        n = plan.rows
        if plan.grown.pages:
            grown = plan.grown
            self.rows.set_pages(grown.rows, grown.logical, grown.pages)
            self._own(grown)
        started = self.clock.start()
        self._decoding = n
        self._step(n, plan.full_sort, plan.longest)
        self.clock.stop(started, self._bucket(n))
        buffer = self._host_tokens[self._flip]
        self._flip ^= 1
        buffer[:n].copy_(self.rows.sampled[:n], non_blocking=True)
        ready = (
            waits.ready_event(waits.sleeps_for_decode(n)) if self.device.type == "cuda" else None
        )
        return Launched(rows=n, tokens=buffer, ready=ready)

    def collect(self, step: Launched) -> np.ndarray:
        """A launched step's tokens, one per row (waits for the step)."""
        if step.ready is not None:
            step.ready.synchronize()
        self.clock.settle()
        tokens: np.ndarray = step.tokens[: step.rows].numpy()
        return tokens

    def _step(self, n: int, full: bool, longest: int) -> None:
        """One decode step of rows ``0..n-1`` whose longest sequence is ``longest`` tokens."""
        bucket = self._bucket(n)
        if self._graphs is not None:
            self._graphs.replay(bucket, full)
        elif self._static:
            # Compiled for the buckets' shapes only: run the step a graph would run.
            self._decode_and_sample(bucket, full)
        else:
            self._decode_and_sample(n, full, pages_for(longest, self.page_size))

    def _bucket(self, n: int) -> int:
        """The batch-size bucket a step of ``n`` rows runs in."""
        return self._buckets[bisect.bisect_left(self._buckets, n)]

    def time_steps(self) -> dict[int, float]:
        """Seconds of one decode step at each batch-size bucket, measured now (the engine is
        idle: the rows hold nothing, so the steps write only the scratch page): the fastest of
        a few runs. A step is run again only while that is cheap (under ``_RETIME_BELOW_S``):
        a first run at a new shape pays one-time costs (on a CPU several times a small model's
        step), which a 7B's steps on a CPU dwarf; admission reads the times accordingly
        (``policy.drain``)."""
        times: dict[int, float] = {}
        with torch.inference_mode():
            for bucket in self._buckets:
                best = float("inf")
                for _ in range(3):
                    self._synchronize()
                    started = time.perf_counter()
                    self._step(bucket, False, _TYPICAL_CONTEXT)
                    self._synchronize()
                    best = min(best, time.perf_counter() - started)
                    if best > _RETIME_BELOW_S:
                        break
                times[bucket] = best
        return times

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _decode_and_sample(self, batch: int, full: bool, pages: int | None = None) -> None:
        """One decode step of the first ``batch`` rows, ending with the sampled tokens fed back:
        the work a graph captures (no host synchronisation)."""
        hidden = self.model.decode(batch, pages or self._max_pages)
        # The full sort draws its noise a slice of rows at a time (``sample_rows``).
        noise = None if full else race_noise(batch, self.weights.geometry.vocab, False, self.device)
        # The full sort's cumsum over the vocabulary fails inductor's codegen at one row
        # ("NYI TritonSplitDimKernel reductions", torch 2.11); that mode is rare: eager.
        choose = self._choose_tokens if full else self._choose_step
        choose(hidden, noise, batch, full)

    def _choose_tokens(
        self, hidden: torch.Tensor, noise: torch.Tensor | None, batch: int, full: bool
    ) -> None:
        """Logits, the sampler and the chosen tokens written back into the rows: compiled with
        the engine, some sixty small eager kernels become a few fused ones."""
        rows = self.rows
        at_once = full_sort_rows(rows.rows)
        wide = self._two_stage_rows is not None and batch >= self._two_stage_rows
        logits = self.model.logits(hidden)
        tokens = sample_rows(logits, rows.rows_of(batch), full, noise, at_once, two_stage=wide)
        rows.sampled[:batch] = tokens
        rows.tokens[:batch] = tokens
        rows.sampling.seen[:batch].scatter_(1, tokens[:, None], True)
        rows.positions[:batch] += rows.live[:batch]

    def retire(self, retired: Retired) -> None:
        """Pack the rows down as the scheduler did, and forget the freed pages' owners."""
        self.rows.compact(retired.holes, retired.movers, retired.keep, retired.old_n)
        self.cache.clear_owner(retired.freed)
        self._own(retired.owners)

    def _own(self, owners: PageOwners) -> None:
        self.cache.assign(owners.pages, owners.rows, owners.logical)


def _choose(loaded: LoadedModel, config: EngineConfig) -> _Choices:
    """Rows, prefill chunk, graphs, compile, attention and the lone request's kernels for this
    device and model (``plan.py`` holds each decision)."""
    fast, device = config.fast, loaded.device
    moe = not is_dense(loaded.model)
    rows, prefill, graphs, compiled, attention = plan_for(fast, device, loaded.dtype, moe)
    if compiled:
        use_compile_cache(config.model.data_dir)
        # Compiled kernels round to the model's dtype where the eager code does (inductor
        # otherwise keeps float32 between fused operations): closer to transformers in bf16.
        if hasattr(torch._inductor.config, "emulate_precision_casts"):
            torch._inductor.config.emulate_precision_casts = True
    fp8 = None if loaded.fp8_checkpoint is None else Fp8Checkpoint.open(loaded.fp8_checkpoint)
    capability = Capability.of(device, fast.capability)
    fused_rope = fused_rope_for(fast.fused_rope, loaded.dtype, device)
    ready = pdl_ready(fast.pdl, graphs, capability, fused_rope, attention)
    capturable = capability.prefill_kernel(loaded.dtype) != "sdpa"
    cuda = device.type == "cuda"
    graph_tokens = prefill_graph_tokens_for(
        fast.prefill_graph_tokens, graphs, capturable, prefill, cuda
    )
    kv_dtype = kv_dtype_for(fast.kv_cache_dtype, loaded.dtype, capability, attention)
    return _Choices(
        rows,
        prefill,
        graphs,
        compiled,
        attention,
        fused_rope,
        ready,
        fp8,
        capability,
        graph_tokens,
        kv_dtype,
    )
