"""The lookup of 4-bit codes in registers: the PTX that ``four_bit_kernel.four_bit_row`` runs
for every four bytes of a lone row's weight.

A 4-bit code stands for one of 16 arbitrary values (NF4's quantiles of a normal distribution,
FP4's), so dequantizing it is a lookup. bitsandbytes' GEMV reads its table from shared memory and
the engine's earlier kernel from the cache, a load per weight, which held a lone 4-bit row far
under the memory's pace (docs/benchmarks.md). Here the table lives in eight registers: ``prmt``
(byte permute) picks four bytes out of eight by four 3-bit selectors, so the 16 values' low bytes
sit in four 32-bit words and their high bytes in four more (value ``i``'s byte at bits
``8 * (i % 4)`` of word ``i // 4``, made by the kernel from the format's table); two ``prmt``
each (codes 0-7 and 8-15) and a third choosing between them by the codes' top bits look four
codes up at once, and two more interleave low and high bytes into pairs of 16-bit values, as the
activations come. The four pairs are multiplied by their activations and summed in 16-bit
pairs (one multiply, three fused multiply-adds: each of the two lanes sums four products), and
the two lanes added in float32: four 16-bit roundings a product where bitsandbytes' GEMV rounds
a product once and sums in float32, within the dtype's precision (the fidelity runs measure it).

Operands, one 32-bit word of codes a call (``tl.inline_asm_elementwise`` with ``pack=1``, so
that which bytes a call sums does not depend on how Triton lays a tensor's elements out in a
thread's registers): ``$0`` the float32 sum of the word's eight products, ``$1`` the word (four
bytes, the first input's code in each byte's high half, bitsandbytes' order; byte ``k`` at bits
``8 * k``), ``$2``-``$5`` byte ``k``'s two activations as one 32-bit pair (the first in the low
half), ``$6``-``$13`` the eight table words (low bytes' four, high bytes' four).
"""

from __future__ import annotations

import torch

# The interleaving selectors: a pair's first value is the byte's high code (odd nibble), the
# second its low code; low byte then high byte of each 16-bit value.
_PAIR_SELECTORS = ("0x4051", "0x6273")
# ``lookup_asm``'s operands: the codes, the activations (a pair a byte), the table words.
_CODES = "$1"
_ACTIVATIONS = [f"${2 + k}" for k in range(4)]
_TABLE_OPERANDS = [f"${6 + i}" for i in range(8)]
CONSTRAINTS = "=f," + ",".join(["r"] * (1 + 4 + 8))
# ``values_asm``'s: the four pairs of values out, the codes, the table words.
VALUES_CONSTRAINTS = "=r,=r,=r,=r," + ",".join(["r"] * (1 + 8))
# ``dot_asm``'s: the sum out, the four pairs of values, the activations.
DOT_CONSTRAINTS = "=f," + ",".join(["r"] * (4 + 4))
_VALUES = ("v0", "v1", "v2", "v3")


def _lookup(selectors: str, choices: str, out: tuple[str, str], table: list[str]) -> list[str]:
    """Four codes (the nibbles ``selectors`` and ``choices`` were made of) looked up in the
    ``table`` words into two pairs of 16-bit values, ``out``."""
    low, high = table[:4], table[4:]
    return [
        f"prmt.b32 a, {low[0]}, {low[1]}, {selectors};",
        f"prmt.b32 b, {low[2]}, {low[3]}, {selectors};",
        f"prmt.b32 lo, a, b, {choices};",
        f"prmt.b32 a, {high[0]}, {high[1]}, {selectors};",
        f"prmt.b32 b, {high[2]}, {high[3]}, {selectors};",
        f"prmt.b32 hi, a, b, {choices};",
        f"prmt.b32 {out[0]}, lo, hi, {_PAIR_SELECTORS[0]};",
        f"prmt.b32 {out[1]}, lo, hi, {_PAIR_SELECTORS[1]};",
    ]


def _look_up_word(codes: str, table: list[str], values: tuple[str, ...]) -> list[str]:
    """The word of eight ``codes`` looked up in the ``table`` words into four pairs."""
    return [
        # Each nibble's low three bits select a byte of codes 0-7's words or of codes 8-15's
        # (``prmt`` reads a selector's top bit as a mode, so it is cleared); its top bit, moved
        # to bit 2, then chooses byte k of the first (k) or of the second (4 + k).
        f"and.b32 s, {codes}, 0x77777777;",
        f"shr.b32 t, {codes}, 1;",
        "lop3.b32 t, t, 0x44444444, 0x32103210, 0xEA;",
        *_lookup("s", "t", (values[0], values[1]), table),
        "shr.b32 s, s, 16;",
        "shr.b32 t, t, 16;",
        *_lookup("s", "t", (values[2], values[3]), table),
    ]


def _sum(dtype: torch.dtype, values: tuple[str, ...], activations: list[str]) -> list[str]:
    """The four pairs of ``values`` times their ``activations``, summed lane by lane in
    ``dtype`` pairs, then the two lanes in float32 into ``$0``."""
    v, x = values, activations
    if dtype == torch.float16:
        products = [
            f"mul.rn.f16x2 p, {v[0]}, {x[0]};",
            f"fma.rn.f16x2 p, {v[1]}, {x[1]}, p;",
            f"fma.rn.f16x2 p, {v[2]}, {x[2]}, p;",
            f"fma.rn.f16x2 p, {v[3]}, {x[3]}, p;",
        ]
        return [
            *products,
            "mov.b32 {e0, e1}, p;",
            "cvt.f32.f16 f0, e0;",
            "cvt.f32.f16 f1, e1;",
            "add.f32 $0, f0, f1;",
        ]
    # bfloat16 (sm_80 has no bf16x2 multiply: the first product adds -0), widened by its bits.
    return [
        "mov.b32 p, 0x80008000;",
        f"fma.rn.bf16x2 p, {v[0]}, {x[0]}, p;",
        f"fma.rn.bf16x2 p, {v[1]}, {x[1]}, p;",
        f"fma.rn.bf16x2 p, {v[2]}, {x[2]}, p;",
        f"fma.rn.bf16x2 p, {v[3]}, {x[3]}, p;",
        "shl.b32 w0, p, 16;",
        "and.b32 w1, p, 0xFFFF0000;",
        "mov.b32 f0, w0;",
        "mov.b32 f1, w1;",
        "add.f32 $0, f0, f1;",
    ]


def _sixteen_bits(dtype: torch.dtype) -> None:
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"the 4-bit lookup multiplies 16-bit activations, not {dtype}")


def _block(lines: list[str]) -> str:
    """``lines`` in a scope of their own registers, on one line: inductor writes a captured
    kernel's string arguments into the Python source it generates as one-line literals (a
    newline there failed the compiled step's import)."""
    registers = [
        ".reg .b32 s, t, a, b, lo, hi, v0, v1, v2, v3, p, w0, w1;",
        ".reg .b16 e0, e1;",
        ".reg .f32 f0, f1;",
    ]
    return " ".join(["{", *registers, *lines, "}"])


def lookup_asm(dtype: torch.dtype) -> str:
    """The PTX for activations of ``dtype`` (float16 or bfloat16), its statements on one line;
    the module's docstring gives its operands."""
    _sixteen_bits(dtype)
    return _block(
        [*_look_up_word(_CODES, _TABLE_OPERANDS, _VALUES), *_sum(dtype, _VALUES, _ACTIVATIONS)]
    )


def values_asm() -> str:
    """``lookup_asm``'s lookup alone, for several rows of activations: ``$0``-``$3`` the word's
    four pairs of 16-bit values (the byte ``k``'s at ``$k``, the high code's value in the low
    half), ``$4`` the word, ``$5``-``$12`` the table words."""
    table = [f"${5 + i}" for i in range(8)]
    return _block(_look_up_word("$4", table, ("$0", "$1", "$2", "$3")))


def dot_asm(dtype: torch.dtype) -> str:
    """``lookup_asm``'s products alone: ``$0`` the float32 sum of the four pairs of values
    ``$1``-``$4`` (``values_asm``'s) times their activations ``$5``-``$8``."""
    _sixteen_bits(dtype)
    return _block(_sum(dtype, ("$1", "$2", "$3", "$4"), [f"${5 + k}" for k in range(4)]))
