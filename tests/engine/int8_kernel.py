"""A kernel of the tests' own around ``quant_gemv_kernel.int8_as_float`` (a Triton function is
called only from a kernel): imported by the tests that need Triton, once they know it is here."""

from __future__ import annotations

import triton
import triton.language as tl

from service.engine.fast.quant_gemv_kernel import int8_as, int8_as_float


@triton.jit  # type: ignore[untyped-decorator]
def convert_int8(values_ptr, out_ptr, count, block: tl.constexpr):  # type: ignore[no-untyped-def]
    """``out[i] = int8_as_float(values[i])`` for ``count`` values."""
    at = tl.arange(0, block)
    values = tl.load(values_ptr + at, mask=at < count, other=0)
    tl.store(out_ptr + at, int8_as_float(values), mask=at < count)


@triton.jit  # type: ignore[untyped-decorator]
def convert_int8_to(values_ptr, out_ptr, count, block: tl.constexpr):  # type: ignore[no-untyped-def]
    """``out[i] = int8_as(values[i], out's dtype)`` for ``count`` values."""
    at = tl.arange(0, block)
    values = tl.load(values_ptr + at, mask=at < count, other=0)
    tl.store(out_ptr + at, int8_as(values, out_ptr.dtype.element_ty), mask=at < count)
