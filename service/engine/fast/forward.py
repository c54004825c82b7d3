"""The transformer itself, written out over the fused weights and the paged cache.

The arithmetic is transformers' Hunyuan models operation for operation (RMSNorm in float32 and
back, RoPE and the query and key norms in each model's order, SiLU-gated MLP or the mixture of
experts, residuals in the model's dtype), so in float32 it computes what ``generate()`` computes.
Two entry points:

- ``prefill``: packed prompts (or chunks of them) of any lengths, keys and values written to
  their pages, causal attention per sequence with torch's varlen flash kernel; returns the
  logits of the positions asked for (the last of each finished prompt).
- ``decode``: the last layer's hidden state for the token in each of the first ``batch`` rows
  of ``DeviceRows`` (``logits`` turns it into logits), everything read from and written to
  device buffers, so it can be captured in a CUDA graph. Compiled (``compile_scope``): the step's
  inputs (lengths, cache slots, embeddings, RoPE rows) as one function, and the layers either
  one at a time (``layer``: one compiled function serves every layer, since the layers differ
  only in the tensors passed in; quick to compile) or as the whole stack (``step``: inductor may
  also fuse across layer boundaries; much slower to compile). With ``static_decode`` each
  decode function compiles once per batch size it is run at (the engine's buckets), with kernels
  specialised to that size; otherwise the batch size turns symbolic at the second size, and
  every later bucket shares that graph. With ``fused_rope`` a decode layer's RoPE, query/key
  norms and cache writes are one kernel (``rope.py``), a prefill layer's too, with its copies
  of kept prefixes and its reads of the cache one kernel each (``slots.py``); with every norm
  folded into a dense model's projections, a lone request's step passes each norm's sum of
  squares from the one-row projection that writes its row to the one that reads it
  (``_norm_sums``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from service.engine.capability import PrefillKernel
from service.engine.fast import gemv, swiglu_fp8
from service.engine.fast.attention import DecodeAttention
from service.engine.fast.batch import DeviceRows
from service.engine.fast.cache import PagedKVCache, write_kv
from service.engine.fast.moe import moe_block
from service.engine.fast.prefill import PackedPrefill
from service.engine.fast.prefill_attention import packed_causal_attention
from service.engine.fast.projections import gated_down, gated_product, product, project, rms_norm
from service.engine.fast.rope import rope_and_store
from service.engine.fast.slots import copy_slots, gather_kv
from service.engine.fast.weights import Geometry, LayerWeights, ModelWeights


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qkv_projection(
    x: torch.Tensor,
    layer: LayerWeights,
    g: Geometry,
    sums: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """The fused QKV product ``[tokens, (heads + 2 * kv_heads) * head_dim]`` of the layer's
    normed input (``sums``: the layer's sums of squares, ``_norm_sums``; ``pdl``: the one-row
    kernel launched with programmatic dependent launch)."""
    if layer.input_norm is None:  # folded into the QKV weights
        norm_sum = None if sums is None else sums[0:1]
        return project(x, layer.qkv, norm_eps=g.eps, norm_sum=norm_sum, pdl=pdl)
    return project(rms_norm(x, layer.input_norm, g.eps), layer.qkv, pdl=pdl)


def rotate_and_normalise(
    qkv: torch.Tensor,
    query_norm: torch.Tensor | None,
    key_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    g: Geometry,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``[tokens, heads, dim]``, keys and values ``[tokens, kv_heads, dim]`` of a QKV
    product: RoPE on queries and keys, and their norms before or after it, by model."""
    tokens = qkv.shape[0]
    q_width, kv_width = g.heads * g.head_dim, g.kv_heads * g.head_dim
    q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
    q = q.reshape(tokens, g.heads, g.head_dim)
    k = k.reshape(tokens, g.kv_heads, g.head_dim)
    v = v.reshape(tokens, g.kv_heads, g.head_dim)
    normed = query_norm is not None and key_norm is not None
    if normed and g.norm_before_rope:
        q, k = _qk_norm(q, k, query_norm, key_norm, g)
    c, s = cos[:, None, :], sin[:, None, :]
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    if normed and not g.norm_before_rope:
        q, k = _qk_norm(q, k, query_norm, key_norm, g)
    return q, k, v


def attention_inputs(
    x: torch.Tensor,
    layer: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    g: Geometry,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``[tokens, heads, dim]``, keys and values ``[tokens, kv_heads, dim]``."""
    qkv = qkv_projection(x, layer, g)
    return rotate_and_normalise(qkv, layer.query_norm, layer.key_norm, cos, sin, g)


def _qk_norm(
    q: torch.Tensor,
    k: torch.Tensor,
    query_norm: torch.Tensor | None,
    key_norm: torch.Tensor | None,
    g: Geometry,
) -> tuple[torch.Tensor, torch.Tensor]:
    assert query_norm is not None
    assert key_norm is not None
    return rms_norm(q, query_norm, g.eps), rms_norm(k, key_norm, g.eps)


def attention_output(
    x: torch.Tensor,
    attended: torch.Tensor,
    layer: LayerWeights,
    g: Geometry,
    sums: torch.Tensor | None = None,
    next_sums: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """The residual stream after the output projection and the MLP (``sums``, ``next_sums``:
    this layer's and the next one's sums of squares, ``_norm_sums``; ``pdl`` as for
    ``qkv_projection``)."""
    attended = attended.reshape(x.shape[0], -1)
    if sums is None or next_sums is None:
        x = project(attended, layer.o, residual=x, pdl=pdl)
    else:
        # The output projection's row is the post-attention norm's input: its squares go to
        # that norm's sum; the QKV projection has read this layer's input sum.
        x = project(attended, layer.o, residual=x, sum_into=sums[1:2], zero=sums[0:1], pdl=pdl)
    if layer.moe is not None:
        return x + moe_block(rms_norm(x, layer.post_norm, g.eps), layer.moe)
    assert layer.gate_up is not None
    assert layer.down is not None
    if swiglu_fp8.runs(x, layer.down):  # FP8 rows on a GPU: the activation cast by one kernel
        if layer.post_norm is None:  # folded into the gate/up weights
            return gated_down(x, layer.gate_up, layer.down, x, g.eps)
        normed = rms_norm(x, layer.post_norm, g.eps)
        return gated_down(normed, layer.gate_up, layer.down, x)
    if layer.post_norm is None:  # folded into the gate/up weights
        norm_sum = None if sums is None else sums[1:2]
        activated = gated_product(x, layer.gate_up, g.eps, norm_sum, pdl)
    else:
        activated = gated_product(rms_norm(x, layer.post_norm, g.eps), layer.gate_up, pdl=pdl)
    if sums is None or next_sums is None:
        return project(activated, layer.down, residual=x, pdl=pdl)
    # The layer's output is the next layer's input: its squares go to the next input sum.
    following, mine = next_sums[0:1], sums[1:2]
    return project(activated, layer.down, residual=x, sum_into=following, zero=mine, pdl=pdl)


class Transformer:
    def __init__(
        self,
        weights: ModelWeights,
        cache: PagedKVCache,
        rows: DeviceRows,
        attention: DecodeAttention,
        compile_scope: str | None,
        static_decode: bool = False,
        fused_rope: bool = False,
        one_row_pdl: bool = False,
        prefill_kernel: PrefillKernel = "sdpa",
    ) -> None:
        self.weights = weights
        # Prefill attention's kernel (flash, memory-efficient or SDPA): capability.py decides.
        self._prefill_kernel = prefill_kernel
        # The decode layer's RoPE, query/key norms and cache writes as one kernel (rope.py).
        self._fused_rope = fused_rope
        self.cache = cache
        self.rows = rows
        self.attention = attention
        self._sums = _norm_sums(weights, rows.device)
        if one_row_pdl and not (fused_rope and self._sums is not None):
            raise ValueError("one-row PDL needs the fused RoPE and the passed norm sums")
        # A lone request's layers then launch nothing but the engine's own kernels, eagerly
        # (in the graph's capture), with programmatic dependent launch (launch.py).
        self._one_row_pdl = one_row_pdl
        self._layer: Callable[..., torch.Tensor] = self._decode_layer
        self._stack: Callable[..., torch.Tensor] = self._decode_stack
        self._inputs: Callable[[int], tuple[torch.Tensor, ...]] = self._step_inputs
        self._prefill_in: Callable[..., tuple[torch.Tensor, ...]] = attention_inputs
        self._prefill_qkv: Callable[..., torch.Tensor] = qkv_projection
        self._prefill_out: Callable[..., torch.Tensor] = attention_output
        # The prefill's token count stays dynamic whatever the decode does: prompt lengths vary.
        decode_dynamic = False if static_decode else None
        if compile_scope is not None:
            # A dozen small eager kernels become one or two.
            self._inputs = torch.compile(self._step_inputs, fullgraph=True, dynamic=decode_dynamic)
            # Eager, a prefill launches each small operation of each layer from the host (a
            # lone request's prompt pays for that once per layer); compiled, the work around the
            # attention kernel is a few kernels per layer. dynamic=None, as for the decode
            # layer: the token count becomes dynamic at its second size (the engine runs the
            # sizes before it is ready).
            self._prefill_in = torch.compile(attention_inputs, fullgraph=True, dynamic=None)
            self._prefill_qkv = torch.compile(qkv_projection, fullgraph=True, dynamic=None)
            self._prefill_out = torch.compile(attention_output, fullgraph=True, dynamic=None)
        if compile_scope == "step":
            self._stack = torch.compile(self._decode_stack, fullgraph=True, dynamic=decode_dynamic)
        elif compile_scope == "layer":
            # dynamic=None: the first bucket compiles static, the next one marks the batch size
            # dynamic, so every other bucket reuses that graph; False: a compile per bucket.
            self._layer = torch.compile(self._decode_layer, fullgraph=True, dynamic=decode_dynamic)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weights
        x = rms_norm(x, w.norm, w.geometry.eps)
        head = w.lm_head
        # A quantized head by the engine's own kernels (projections.py): one row, or a batch.
        out = project(x, head) if head.bitsandbytes else product(x, head)
        return out[:, : w.geometry.vocab].float()

    def prefill(self, packed: PackedPrefill) -> torch.Tensor:
        """Float32 logits ``[len(packed.last), vocab]`` at the token indices ``packed.last``."""
        w, g, p = self.weights, self.weights.geometry, packed
        x = torch.nn.functional.embedding(p.tokens, w.embed)
        cos, sin = w.rope(p.positions)
        for index, layer in enumerate(w.layers):
            q, k, v = self._prefill_attention_inputs(index, x, layer, cos, sin, p)
            attended = packed_causal_attention(
                q,
                k,
                v,
                p.cu_q,
                p.cu_k,
                p.max_q,
                p.max_k,
                g.scale,
                self._prefill_kernel,
                p.host_starts,
            )
            x = self._prefill_out(x, attended, layer, g)
        return self.logits(x.index_select(0, p.last))

    def _prefill_attention_inputs(
        self,
        index: int,
        x: torch.Tensor,
        layer: LayerWeights,
        cos: torch.Tensor,
        sin: torch.Tensor,
        p: PackedPrefill,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``index``'s queries of a prefill step, and the keys and values they attend to:
        the step's own written to their slots and the kept prefixes copied into place first,
        then every sequence's read back where a piece has a prefix. With ``fused_rope`` the
        engine's own kernels do the writes, the copies and the reads (rope.py, slots.py)."""
        g, cache = self.weights.geometry, self.cache
        keys, values = cache.keys[index], cache.values[index]
        copy_from, copy_to = p.copy_from, p.copy_to
        if not self._fused_rope:
            q, k, v = self._prefill_in(x, layer, cos, sin, g)
            write_kv(keys, values, p.slots, k, v)
            if copy_from is not None and copy_to is not None:
                cache.copy(index, copy_from, copy_to)
            if p.key_slots is not None:
                k, v = cache.gather(index, p.key_slots)
            return q, k, v
        qkv = self._prefill_qkv(x, layer, g)
        q = rope_and_store(
            qkv, cos, sin, layer.query_norm, layer.key_norm, keys, values, p.slots, g
        )
        if copy_from is not None and copy_to is not None:
            copy_slots(keys, values, copy_from, copy_to)
        # The step's own keys read back too where no piece has a prefix: the kernel above
        # wrote them to the cache only.
        read = p.slots if p.key_slots is None else p.key_slots
        k, v = gather_kv(keys, values, read, cache.compute)
        return q, k, v

    def decode(self, batch: int, pages: int) -> torch.Tensor:
        """The last layer's output ``[batch, hidden]`` for the tokens in the first ``batch`` rows
        (before the final norm: ``logits`` applies it); no host sync."""
        x, cos, sin, slots = self._inputs(batch)
        meta = self.attention.prepare(batch, pages)
        if batch == 1 and self._one_row_pdl:
            return self._decode_stack(x, cos, sin, slots, meta, pdl=True)
        return self._stack(x, cos, sin, slots, meta)

    def _step_inputs(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Each row's length (written for the attention mask), the cache slot its new key goes
        to, its token's embedding and its position's RoPE rows."""
        rows, page, w = self.rows, self.cache.page_size, self.weights
        positions = rows.positions[:batch]
        rows.lengths[:batch] = ((positions + 1) * rows.live[:batch]).to(torch.int32)
        table = rows.block_table[:batch]
        current = table.gather(1, (positions // page)[:, None]).squeeze(1).long()
        slots = current * page + positions % page
        x = torch.nn.functional.embedding(rows.tokens[:batch], w.embed)
        if self._sums is not None and batch == 1:
            # The first layer's input norm reads the embedding's sum of squares; the last
            # layer's output adds its squares to a spare sum nothing reads, cleared here.
            self._sums[0][0:1].copy_(x.float().pow(2).sum(-1))
            self._sums[-1].zero_()
        return x, *w.rope(positions), slots

    def _decode_stack(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        meta: object,
        pdl: bool = False,
    ) -> torch.Tensor:
        """The layers in turn: compiled (``_layer``), or with ``pdl`` the uncompiled layer,
        whose kernels then launch with programmatic dependent launch."""
        w, cache, sums = self.weights, self.cache, self._sums
        run = functools.partial(self._decode_layer, pdl=True) if pdl else self._layer
        for index, layer in enumerate(w.layers):
            keys, values = cache.keys[index], cache.values[index]
            mine, following = (None, None) if sums is None else (sums[index], sums[index + 1])
            x = run(x, layer, keys, values, slots, cos, sin, meta, mine, following)
        return x

    def _decode_layer(
        self,
        x: torch.Tensor,
        layer: LayerWeights,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: object,
        sums: torch.Tensor | None = None,
        next_sums: torch.Tensor | None = None,
        pdl: bool = False,
    ) -> torch.Tensor:
        g = self.weights.geometry
        qkv = qkv_projection(x, layer, g, sums, pdl)
        if self._fused_rope:
            q = rope_and_store(
                qkv, cos, sin, layer.query_norm, layer.key_norm, keys, values, slots, g, pdl
            )
        else:
            q, k, v = rotate_and_normalise(qkv, layer.query_norm, layer.key_norm, cos, sin, g)
            write_kv(keys, values, slots, k, v)
        attended = self.attention(q, keys, values, meta, g.scale, pdl)
        return attention_output(x, attended, layer, g, sums, next_sums, pdl)


def passes_norm_sums(weights: ModelWeights, device: torch.device) -> bool:
    """Whether a lone request's decode step passes each norm's sum of squares from the one-row
    projection that writes its row to the one that reads it: where the one-row kernel runs
    every projection (``gemv.one_row``) and every norm of the model is folded into a dense
    layer's projection (``fold_norms``)."""
    folded = all(
        layer.input_norm is None and layer.post_norm is None and layer.moe is None
        for layer in weights.layers
    )
    return folded and gemv.runs(weights.embed.dtype, device)


def _norm_sums(weights: ModelWeights, device: torch.device) -> list[torch.Tensor] | None:
    """Per layer (and one spare), the sums of squares of its input and of its post-attention
    row, ``[2]`` in float32, where ``passes_norm_sums``: the projection that writes a row adds
    up its squares, the one that reads it normalises with the sum, and the next projection
    clears it. None elsewhere."""
    if not passes_norm_sums(weights, device):
        return None
    count = len(weights.layers) + 1
    return [torch.zeros(2, dtype=torch.float32, device=device) for _ in range(count)]
