"""The Triton kernel behind ``rope.rope_and_store`` (``rope.py`` says what it computes).

Its own module, so that ``rope.py`` imports where there is no Triton (a CPU build of torch has
none): there this module's import fails and the kernel is never used.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _rounded(x, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    # What an eager operation in the model's dtype leaves: float32 arithmetic, rounded once.
    return x.to(dtype).to(tl.float32)


@triton.jit  # type: ignore[untyped-decorator]
def _cached(x, ptr, fp8: tl.constexpr):  # type: ignore[no-untyped-def]
    # As the cache stores it: an 8-bit cache's values past its largest clamped (``cache.stored``).
    if fp8:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)
    return x.to(ptr.dtype.element_ty)


@triton.jit  # type: ignore[untyped-decorator]
def _norm(  # type: ignore[no-untyped-def]
    x1, x2, w_ptr, lo, half: tl.constexpr, eps: tl.constexpr, dtype: tl.constexpr
):
    # transformers' RMSNorm over one head: float32 statistics, the row back in the model's
    # dtype, then times the weight (itself a product in the model's dtype).
    rstd = tl.math.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * half) + eps)
    w1 = tl.load(w_ptr + lo).to(tl.float32)
    w2 = tl.load(w_ptr + half + lo).to(tl.float32)
    return _rounded(w1 * _rounded(x1 * rstd, dtype), dtype), _rounded(
        w2 * _rounded(x2 * rstd, dtype), dtype
    )


@triton.jit  # type: ignore[untyped-decorator]
def rope_store(  # type: ignore[no-untyped-def]
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    query_norm_ptr,
    key_norm_ptr,
    slots_ptr,
    key_ptr,
    value_ptr,
    out_ptr,
    stride_x,
    stride_rope,
    stride_cache_head,
    stride_cache_slot,
    stride_ob,
    stride_oh,
    # Constants of the model; as constexprs they stay float32 and fold into the code.
    eps: tl.constexpr,
    heads: tl.constexpr,
    kv_heads: tl.constexpr,
    half: tl.constexpr,
    qk_norm: tl.constexpr,
    norm_first: tl.constexpr,
    per_program: tl.constexpr,
    pdl: tl.constexpr,
    fp8_cache: tl.constexpr,
):
    if pdl:  # programmatic dependent launch, as in gemv_kernel.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    lo = tl.arange(0, half)
    dtype = out_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + row).to(tl.int64)
    for i in tl.static_range(per_program):
        # Query heads, then key heads, then value heads; ``per_program`` of them in turn.
        head = tl.program_id(1) * per_program + i
        if head < heads + 2 * kv_heads:
            src = qkv_ptr + row * stride_x + head * (2 * half)
            if head >= heads + kv_heads:
                # A value head: into its cache slot as it is.
                value_head = (head - heads - kv_heads).to(tl.int64)
                to = value_ptr + value_head * stride_cache_head + slot * stride_cache_slot
                tl.store(to + lo, _cached(tl.load(src + lo), value_ptr, fp8_cache))
                tl.store(to + half + lo, _cached(tl.load(src + half + lo), value_ptr, fp8_cache))
            else:
                is_query = head < heads
                norm_ptr = key_norm_ptr
                if is_query:
                    norm_ptr = query_norm_ptr
                x1 = tl.load(src + lo).to(tl.float32)
                x2 = tl.load(src + half + lo).to(tl.float32)
                if qk_norm and norm_first:
                    x1, x2 = _norm(x1, x2, norm_ptr, lo, half, eps, dtype)
                rope = row * stride_rope
                c1 = tl.load(cos_ptr + rope + lo).to(tl.float32)
                c2 = tl.load(cos_ptr + rope + half + lo).to(tl.float32)
                s1 = tl.load(sin_ptr + rope + lo).to(tl.float32)
                s2 = tl.load(sin_ptr + rope + half + lo).to(tl.float32)
                # x * cos + rotate_half(x) * sin, each product and the sum rounded as eager
                # rounds them (rotate_half's negation is exact).
                y1 = _rounded(_rounded(x1 * c1, dtype) - _rounded(x2 * s1, dtype), dtype)
                y2 = _rounded(_rounded(x2 * c2, dtype) + _rounded(x1 * s2, dtype), dtype)
                if qk_norm and not norm_first:
                    y1, y2 = _norm(y1, y2, norm_ptr, lo, half, eps, dtype)
                y1, y2 = y1.to(dtype), y2.to(dtype)
                # Each branch its own pointer: a name bound in both must have one type, and
                # an 8-bit cache's pointer is not the queries'.
                if is_query:
                    to_query = out_ptr + row * stride_ob + head * stride_oh
                    tl.store(to_query + lo, y1)
                    tl.store(to_query + half + lo, y2)
                else:
                    key_head = (head - heads).to(tl.int64)
                    to_key = key_ptr + key_head * stride_cache_head + slot * stride_cache_slot
                    tl.store(to_key + lo, _cached(y1, key_ptr, fp8_cache))
                    tl.store(to_key + half + lo, _cached(y2, key_ptr, fp8_cache))
