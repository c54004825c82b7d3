"""The lookup of 4-bit codes in registers: the PTX text that ``quant_gemv_kernel.four_bit_row``
runs for every four bytes of a lone row's weight, built from the format's 16 values.

A 4-bit code stands for one of 16 arbitrary values (NF4's quantiles of a normal distribution,
FP4's), so dequantizing it is a lookup. bitsandbytes' GEMV reads its table from shared memory and
the engine's earlier kernel from the cache, a load per weight, which held a lone 4-bit row far
under the memory's pace (docs/benchmarks.md). Here the table lives in the instructions
themselves: ``prmt`` (byte permute) picks four bytes out of eight by four 3-bit selectors, so
the 16 values' low bytes sit in four 32-bit immediates and their high bytes in four more; two
``prmt`` each (codes 0-7 and 8-15) and a ``lop3`` choosing between them by the codes' top bits
look four codes up at once, and two more ``prmt`` interleave low and high bytes into the pairs
of 16-bit values the activations come in. Each pair is multiplied by its two activations in one
16-bit instruction (rounded once, as bitsandbytes' GEMV rounds its products) and the two
products summed in float32.

Operands, as ``tl.inline_asm_elementwise`` passes four elements at a time (``pack=4``):
``$0``-``$3`` the float32 sums of the four bytes, ``$4`` the four bytes of codes (the first
input's code in each byte's high half, bitsandbytes' order), ``$5``-``$8`` each byte's two
activations as one 32-bit pair (the first in the low half).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The interleaving selectors: a pair's first value is the byte's high code (odd nibble), the
# second its low code; low byte then high byte of each 16-bit value.
_PAIR_SELECTORS = ("0x4051", "0x6273")
# ``lop3``'s truth table for ``c ? b : a`` (a = 0xF0, b = 0xCC, c = 0xAA).
_CHOOSE = "0xD8"


def table_words(values: Sequence[float], dtype: torch.dtype) -> tuple[list[int], list[int]]:
    """The 16 values in ``dtype`` as two lists of four 32-bit words: their low bytes and their
    high bytes, four values a word (value ``i``'s byte at bits ``8 * (i % 4)`` of word
    ``i // 4``), the layout ``prmt`` selects from."""
    if len(values) != 16:
        raise ValueError("a 4-bit format has 16 values")
    bits = torch.tensor(list(values), dtype=torch.float32).to(dtype).view(torch.int16)
    halves = [int(b) & 0xFFFF for b in bits.tolist()]
    low = [h & 0xFF for h in halves]
    high = [h >> 8 for h in halves]

    def words(parts: list[int]) -> list[int]:
        return [sum(parts[4 * w + j] << (8 * j) for j in range(4)) for w in range(4)]

    return words(low), words(high)


def _lookup(selectors: str, masks: str, out: tuple[str, str]) -> list[str]:
    """Four codes (the nibbles ``selectors`` and ``masks`` were made of) looked up in the tables
    (registers ``L0``-``L3``, ``H0``-``H3``) into two pairs of 16-bit values, ``out``."""
    return [
        f"prmt.b32 m, K, K, {masks};",
        f"prmt.b32 a, L0, L1, {selectors};",
        f"prmt.b32 b, L2, L3, {selectors};",
        f"lop3.b32 lo, a, b, m, {_CHOOSE};",
        f"prmt.b32 a, H0, H1, {selectors};",
        f"prmt.b32 b, H2, H3, {selectors};",
        f"lop3.b32 hi, a, b, m, {_CHOOSE};",
        f"prmt.b32 {out[0]}, lo, hi, {_PAIR_SELECTORS[0]};",
        f"prmt.b32 {out[1]}, lo, hi, {_PAIR_SELECTORS[1]};",
    ]


def _product(dtype: torch.dtype, value: str, pair: str, out: str) -> list[str]:
    """The float32 sum of the pair of values ``value`` times the pair of activations ``pair``,
    each product rounded to ``dtype``."""
    if dtype == torch.float16:
        return [
            f"mul.rn.f16x2 p, {value}, {pair};",
            "mov.b32 {e0, e1}, p;",
            "cvt.f32.f16 f0, e0;",
            "cvt.f32.f16 f1, e1;",
            f"add.f32 {out}, f0, f1;",
        ]
    # bfloat16: a product by fma with -0 (sm_80 has no bf16x2 multiply), widened by its bits.
    return [
        f"fma.rn.bf16x2 p, {value}, {pair}, 0x80008000;",
        "shl.b32 w0, p, 16;",
        "and.b32 w1, p, 0xFFFF0000;",
        "mov.b32 f0, w0;",
        "mov.b32 f1, w1;",
        f"add.f32 {out}, f0, f1;",
    ]


def lookup_asm(values: Sequence[float], dtype: torch.dtype) -> str:
    """The PTX for ``values`` (a 4-bit format's 16) and activations of ``dtype`` (float16 or
    bfloat16); the module's docstring gives its operands."""
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"the 4-bit lookup multiplies 16-bit activations, not {dtype}")
    low, high = table_words(values, dtype)
    tables = [f"mov.b32 L{i}, 0x{word:08X};" for i, word in enumerate(low)]
    tables += [f"mov.b32 H{i}, 0x{word:08X};" for i, word in enumerate(high)]
    lines = [
        "{",
        ".reg .b32 L0, L1, L2, L3, H0, H1, H2, H3, K;",
        ".reg .b32 s, t, m, a, b, lo, hi, v0, v1, v2, v3, p, w0, w1;",
        ".reg .b16 e0, e1;",
        ".reg .f32 f0, f1;",
        *tables,
        # ``prmt`` by the masks' 0 or 1 nibbles: byte 0 (0x00) or byte 1 (0xFF) of ``K``.
        "mov.b32 K, 0x0000FF00;",
        # Each nibble's low three bits select a byte; its top bit, moved to the bottom, picks
        # codes 8-15's word (``prmt`` reads a selector's top bit as a mode, so it is cleared).
        "and.b32 s, $4, 0x77777777;",
        "shr.b32 t, $4, 3;",
        "and.b32 t, t, 0x11111111;",
        *_lookup("s", "t", ("v0", "v1")),
        "shr.b32 s, s, 16;",
        "shr.b32 t, t, 16;",
        *_lookup("s", "t", ("v2", "v3")),
    ]
    for byte in range(4):
        lines += _product(dtype, f"v{byte}", f"${5 + byte}", f"${byte}")
    lines.append("}")
    return "\n".join(lines)
