"""The Triton kernel behind ``attention.TritonDecode`` (its docstring says what it computes).

Its own module, so that ``attention.py`` imports where there is no Triton (a CPU build of torch
has none): there this module's import fails and the kernel is never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _operand(x, fp8: tl.constexpr):  # type: ignore[no-untyped-def]
    # With an 8-bit cache the tensor cores' operands are float16: e4m3 becomes float16 in one
    # packed conversion on the GPU, where bfloat16 takes several (over an 8-bit cache the
    # attention converting to bfloat16 ran slower than over a 16-bit one, at half the bytes:
    # docs/benchmarks.md, run 101). float16 holds every e4m3 value exactly.
    if fp8:
        x = x.to(tl.float16)
    return x


@triton.jit  # type: ignore[untyped-decorator]
def paged_decode(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lengths_ptr,
    out_ptr,
    partial_ptr,
    stats_ptr,
    arrivals_ptr,
    stride_qb,
    stride_qh,
    stride_kh,
    stride_ks,
    stride_tb,
    stride_ob,
    stride_oh,
    # A constant of the model; as a constexpr it stays float32 (inductor passes floats as
    # float64, which would promote the scores).
    scale: tl.constexpr,
    min_pages: tl.constexpr,
    group: tl.constexpr,
    group_pad: tl.constexpr,
    dim: tl.constexpr,
    page: tl.constexpr,
    tile: tl.constexpr,
    pdl: tl.constexpr,
    fp8_cache: tl.constexpr,
):
    if pdl:  # programmatic dependent launch, as in gemv_kernel.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_heads = tl.num_programs(1)
    splits_max = tl.num_programs(2)
    length = tl.load(lengths_ptr + row)
    pages = tl.cdiv(length, page)
    # As many splits as the row's pages allow, at least ``min_pages`` each, none empty.
    wanted = tl.maximum(tl.minimum(splits_max, pages // min_pages), 1)
    chunk = tl.cdiv(tl.maximum(pages, 1), wanted)
    splits = tl.cdiv(pages, chunk)
    lanes = tl.arange(0, group_pad)
    lane_ok = lanes < group
    heads = kv_head * group + lanes
    d = tl.arange(0, dim)
    out_at = out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if pages == 0:
        # A row without a request: zeros, so the rest of the step reads numbers.
        if split == 0:
            zero = tl.zeros([group_pad, dim], dtype=tl.float32)
            tl.store(out_at, zero.to(out_ptr.dtype.element_ty), mask=lane_ok[:, None])
    elif split < splits:
        q = tl.load(
            q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :],
            mask=lane_ok[:, None],
            other=0.0,
        )
        q = _operand(q, fp8_cache)
        best = tl.full([group_pad], float("-inf"), dtype=tl.float32)
        total = tl.zeros([group_pad], dtype=tl.float32)
        acc = tl.zeros([group_pad, dim], dtype=tl.float32)
        # The split's pages in tiles of ``tile`` slots, none past the row's length: the last
        # page is read only as far as it is written.
        tiles = page // tile
        first = split * chunk * tiles
        last = tl.minimum(tl.minimum(split * chunk + chunk, pages) * tiles, tl.cdiv(length, tile))
        for step in range(first, last):
            logical = step // tiles
            offsets = (step % tiles) * tile + tl.arange(0, tile)
            physical = tl.load(table_ptr + row * stride_tb + logical).to(tl.int64)
            at = kv_head.to(tl.int64) * stride_kh + (physical * page + offsets)[:, None] * stride_ks
            keys = _operand(tl.load(k_ptr + at + d[None, :]), fp8_cache)
            scores = tl.dot(q, tl.trans(keys)) * scale
            valid = logical * page + offsets < length
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            kept = tl.exp(best - new_best)
            weights = tl.exp(scores - new_best[:, None])
            total = total * kept + tl.sum(weights, axis=1)
            values = _operand(tl.load(v_ptr + at + d[None, :]), fp8_cache)
            acc = acc * kept[:, None] + tl.dot(weights.to(values.dtype), values)
            best = new_best
        if splits == 1:
            tl.store(
                out_at, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=lane_ok[:, None]
            )
        else:
            # Flash-decoding: each split leaves its running max, sum and weighted values; the
            # split that arrives last combines them in split order (the same sums whatever the
            # arrival order) and resets the arrival count for the next launch.
            slot = (row * kv_heads + kv_head) * splits_max
            spot = lanes[:, None] * dim + d[None, :]
            tl.store(partial_ptr + (slot + split) * group_pad * dim + spot, acc)
            tl.store(stats_ptr + (slot + split) * 2 * group_pad + lanes, best)
            tl.store(stats_ptr + (slot + split) * 2 * group_pad + group_pad + lanes, total)
            tl.debug_barrier()  # every lane's stores before the release below
            counter = arrivals_ptr + row * kv_heads + kv_head
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == splits - 1:
                overall = tl.full([group_pad], float("-inf"), dtype=tl.float32)
                for other in range(0, splits):
                    at_stats = stats_ptr + (slot + other) * 2 * group_pad + lanes
                    overall = tl.maximum(overall, tl.load(at_stats, cache_modifier=".cg"))
                combined = tl.zeros([group_pad, dim], dtype=tl.float32)
                weight_sum = tl.zeros([group_pad], dtype=tl.float32)
                for other in range(0, splits):
                    at_stats = stats_ptr + (slot + other) * 2 * group_pad + lanes
                    scaled = tl.exp(tl.load(at_stats, cache_modifier=".cg") - overall)
                    sums = tl.load(at_stats + group_pad, cache_modifier=".cg")
                    part = tl.load(
                        partial_ptr + (slot + other) * group_pad * dim + spot,
                        cache_modifier=".cg",
                    )
                    weight_sum += scaled * sums
                    combined += scaled[:, None] * part
                result = combined / weight_sum[:, None]
                tl.store(out_at, result.to(out_ptr.dtype.element_ty), mask=lane_ok[:, None])
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
