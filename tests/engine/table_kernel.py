"""A kernel of the tests' own around ``four_bit_kernel.table_word`` (a Triton function is called
only from a kernel): imported by the tests that need Triton, once they know it is here."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from service.engine.fast.four_bit_kernel import table_word


@triton.jit
def _words(code_ptr, out_ptr, probe_ptr):  # type: ignore[no-untyped-def]
    """The eight table words ``four_bit_row`` makes, in ``probe``'s dtype, into ``out``."""
    dtype = probe_ptr.dtype.element_ty
    for high in tl.static_range(2):
        for first in tl.static_range(4):
            tl.store(out_ptr + 4 * high + first, table_word(code_ptr, 4 * first, high == 1, dtype))


def table_words_of(code: torch.Tensor, dtype: torch.dtype) -> list[int]:
    """The table words the kernel makes from the float32 values ``code`` for ``dtype``."""
    out = torch.zeros(8, dtype=torch.int32)
    _words[(1,)](code.float(), out, torch.zeros(1, dtype=dtype))
    return [w & 0xFFFFFFFF for w in out.tolist()]
