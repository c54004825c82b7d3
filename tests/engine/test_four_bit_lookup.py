"""The 4-bit lookup's PTX (``four_bit_lookup``), run here by a small interpreter of the
instructions it uses: every word of codes must come out as its values times their activations,
whatever the codes, the values and the activations; and the table words the kernel makes from a
format's values (``four_bit_kernel.table_word``, in Triton's interpreter). A GPU runs the same
text in ``four_bit_kernel``'s kernels (measured by ``loadtests.quant_kernels``; compiled by
ptxas in ``test_kernels_compile.py``)."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.quant_kernels import NF4
from service.engine.fast.four_bit_lookup import dot_asm, lookup_asm, values_asm

# bitsandbytes' FP4 values (``bitsandbytes.functional.get_4bit_type``; NF4's are loadtests').
FP4 = (
    0.0, 0.0052083334885537624, 0.6666666865348816, 1.0, 0.3333333432674408, 0.5,
    0.1666666716337204, 0.25, 0.0, -0.0052083334885537624, -0.6666666865348816, -1.0,
    -0.3333333432674408, -0.5, -0.1666666716337204, -0.25,
)  # fmt: skip
MASK = 0xFFFFFFFF


def _f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits & MASK))[0])


def _bits32(value: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def _halves(bits: int, dtype: torch.dtype) -> list[float]:
    """A 32-bit pair of ``dtype`` values, the low half first, as Python floats."""
    pair = torch.tensor([bits & 0xFFFF, bits >> 16], dtype=torch.int32).to(torch.int16)
    return [float(v) for v in pair.view(dtype).float().tolist()]


def _pair(values: list[float], dtype: torch.dtype) -> int:
    """Two floats rounded to ``dtype`` (round to nearest even) as a 32-bit pair."""
    halves = torch.tensor(values, dtype=torch.float32).to(dtype).view(torch.int16)
    low, high = (int(h) & 0xFFFF for h in halves.tolist())
    return low | high << 16


def _prmt(a: int, b: int, c: int) -> int:
    """PTX ``prmt.b32`` in its default mode."""
    source = (b << 32 | a).to_bytes(8, "little")
    out = 0
    for k in range(4):
        selector = (c >> 4 * k) & 0xF
        byte = source[selector & 7]
        if selector & 8:  # replicate the byte's sign bit
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << 8 * k
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = (a >> bit & 1) << 2 | (b >> bit & 1) << 1 | (c >> bit & 1)
        out |= (lut >> index & 1) << bit
    return out


def table_words(values: tuple[float, ...], dtype: torch.dtype) -> list[int]:
    """The eight table words of ``values`` in ``dtype``: the low bytes' four, then the high
    bytes', value ``i``'s byte at bits ``8 * (i % 4)`` of word ``i // 4``."""
    bits = torch.tensor(values, dtype=torch.float32).to(dtype).view(torch.int16).tolist()
    halves = [b & 0xFFFF for b in bits]
    words = []
    for part in ([h & 0xFF for h in halves], [h >> 8 for h in halves]):
        words += [sum(part[4 * w + j] << (8 * j) for j in range(4)) for w in range(4)]
    return words


def _run(
    asm: str, word: int, pairs: list[int], values: tuple[float, ...], dtype: torch.dtype
) -> float:
    """The output ``$0`` of ``asm`` for the codes ``word`` and activations ``pairs``, with the
    table words of ``values``, as the kernel gives them."""
    regs: dict[str, int] = {"$1": word} | {f"${2 + i}": p for i, p in enumerate(pairs)}
    regs |= {f"${6 + i}": table for i, table in enumerate(table_words(values, dtype))}
    return _f32(_execute(asm, regs)["$0"])


def _execute(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """The registers after ``asm`` ran from ``regs``."""
    regs = dict(regs)

    def value(operand: str) -> int:
        if operand in regs:
            return regs[operand]
        # PTX writes a float32's bits as 0f<hex>.
        return int(operand[2:], 16) if operand.startswith("0f") else int(operand, 0)

    for line in asm.split(";"):
        line = line.strip()
        if not line or line[0] in "{}." or line.startswith("//"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # split a pair into its halves
            halves, source = rest.rsplit(",", 1)
            low, high = (h.strip(" {}") for h in halves.split(","))
            regs[low], regs[high] = regs[source.strip()] & 0xFFFF, regs[source.strip()] >> 16
            continue
        d, *args = (a.strip() for a in rest.split(","))
        v = [value(a) for a in args]
        if op == "mov.b32":
            regs[d] = v[0]
        elif op == "and.b32":
            regs[d] = v[0] & v[1]
        elif op == "shr.b32":
            regs[d] = v[0] >> v[1]
        elif op == "shl.b32":
            regs[d] = (v[0] << v[1]) & MASK
        elif op == "prmt.b32":
            regs[d] = _prmt(*v)
        elif op == "lop3.b32":
            regs[d] = _lop3(*v)
        elif op in ("mul.rn.f16x2", "fma.rn.f16x2", "fma.rn.bf16x2"):
            kind = torch.bfloat16 if "bf16" in op else torch.float16
            a, b = _halves(v[0], kind), _halves(v[1], kind)
            c = _halves(v[2], kind) if len(v) > 2 else [0.0, 0.0]
            # Products of two 16-bit values are exact in float64, so one rounding is RN's.
            regs[d] = _pair([a[i] * b[i] + c[i] for i in range(2)], kind)
        elif op == "cvt.f32.f16":
            regs[d] = _bits32(_halves(v[0], torch.float16)[0])
        elif op == "mov.f32":
            regs[d] = v[0]
        elif op == "add.f32":
            total = torch.tensor(_f32(v[0]), dtype=torch.float32) + _f32(v[1])
            regs[d] = _bits32(float(total))
        else:
            raise AssertionError(f"the interpreter lacks {op}")
    return regs


def _expected(values: tuple[float, ...], word: int, pairs: list[int], dtype: torch.dtype) -> float:
    """The word's sum: in each lane (the bytes' first inputs, their
    high codes, in the pairs' low halves; their second inputs in the high halves) the four
    products summed in ``dtype``, each step rounded once (a multiply, then fused
    multiply-adds), and the two lanes added in float32."""
    table = torch.tensor(values, dtype=torch.float32).to(dtype).float().tolist()
    lanes = [0.0, 0.0]
    for k in range(4):
        byte = word >> 8 * k & 0xFF
        x = _halves(pairs[k], dtype)
        exact = [table[byte >> 4] * x[0] + lanes[0], table[byte & 15] * x[1] + lanes[1]]
        lanes = _halves(_pair(exact, dtype), dtype)
    total = torch.tensor(lanes[0], dtype=torch.float32) + lanes[1]
    return float(total)


_DTYPES = st.sampled_from([torch.float16, torch.bfloat16])
_ACTIVATION = st.floats(-1000.0, 1000.0, allow_nan=False, width=16)
_VALUES = st.one_of(
    st.sampled_from([NF4, FP4]),
    st.tuples(*[st.floats(-4.0, 4.0, allow_nan=False, width=16)] * 16),
)


@settings(max_examples=150, deadline=None)
@given(
    values=_VALUES,
    word=st.integers(0, MASK),
    activations=st.lists(_ACTIVATION, min_size=8, max_size=8),
    dtype=_DTYPES,
)
def test_every_word_is_its_values_times_their_activations(
    values: tuple[float, ...], word: int, activations: list[float], dtype: torch.dtype
) -> None:
    pairs = [_pair(activations[2 * i : 2 * i + 2], dtype) for i in range(4)]
    got = _run(lookup_asm(dtype), word, pairs, values, dtype)
    assert got == _expected(values, word, pairs, dtype)


@settings(max_examples=100, deadline=None)
@given(
    values=_VALUES,
    word=st.integers(0, MASK),
    activations=st.lists(_ACTIVATION, min_size=8, max_size=8),
    dtype=_DTYPES,
)
def test_the_lookup_and_the_products_apart_are_the_lookup_s_sum(
    values: tuple[float, ...], word: int, activations: list[float], dtype: torch.dtype
) -> None:
    # Several rows of activations share one lookup: its four pairs of values out of
    # ``values_asm``, then ``dot_asm`` per row, must give each row the one-row sum exactly.
    pairs = [_pair(activations[2 * i : 2 * i + 2], dtype) for i in range(4)]
    tables = table_words(values, dtype)
    looked_up = _execute(
        values_asm(), {"$4": word} | {f"${5 + i}": t for i, t in enumerate(tables)}
    )
    operands = {f"${1 + k}": looked_up[f"${k}"] for k in range(4)}
    operands |= {f"${5 + k}": pairs[k] for k in range(4)}
    got = _f32(_execute(dot_asm(dtype), operands)["$0"])
    assert got == _expected(values, word, pairs, dtype)
    assert got == _run(lookup_asm(dtype), word, pairs, values, dtype)


@settings(max_examples=100, deadline=None)
@given(values=_VALUES, word=st.integers(0, MASK), dtype=_DTYPES)
def test_the_lookup_alone_gives_each_byte_s_two_values_as_one_pair(
    values: tuple[float, ...], word: int, dtype: torch.dtype
) -> None:
    # ``four_bit_kernel.four_bit_matmul`` splits the pairs into the tensor cores' operands,
    # byte k's pair the inputs 2k (the low half: the byte's high code) and 2k + 1; its tests in
    # Triton's interpreter build the same pairs from the table in memory.
    tables = table_words(values, dtype)
    looked_up = _execute(
        values_asm(), {"$4": word} | {f"${5 + i}": t for i, t in enumerate(tables)}
    )
    for k in range(4):
        byte = word >> 8 * k & 0xFF
        expected = _pair([values[byte >> 4], values[byte & 15]], dtype)
        assert looked_up[f"${k}"] & MASK == expected


def test_every_code_is_looked_up_in_every_place_of_a_word() -> None:
    """All 16 codes in each of the eight places (the codes 8-15, the second table words,
    included), the others' activations zero."""
    for place in range(8):
        activations = [0.0] * 8
        activations[place] = 1.0
        pairs = [_pair(activations[2 * i : 2 * i + 2], torch.float16) for i in range(4)]
        for code in range(16):
            # The place's code in its byte's high half for the byte's first input.
            shift = 8 * (place // 2) + (4 if place % 2 == 0 else 0)
            word = code << shift
            got = _run(lookup_asm(torch.float16), word, pairs, NF4, torch.float16)
            assert got == _expected(NF4, word, pairs, torch.float16)
            assert got == torch.tensor(NF4[code], dtype=torch.float16).item()


def test_the_kernel_makes_the_table_words_from_the_format_s_values() -> None:
    pytest.importorskip("triton")
    from tests.engine.table_kernel import table_words_of

    for values in (NF4, FP4):
        for dtype in (torch.float16, torch.bfloat16):
            assert table_words_of(torch.tensor(values), dtype) == table_words(values, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_lookup_is_one_line(dtype: torch.dtype) -> None:
    # Inductor writes the string into the Python source of a compiled step as a one-line
    # literal: with its statements on lines of their own, the step failed to import on the
    # H200 (docs/benchmarks.md, run 116).
    assert "\n" not in lookup_asm(dtype) + values_asm() + dot_asm(dtype)


def test_only_16_bit_activations_are_looked_up() -> None:
    with pytest.raises(ValueError, match="16-bit"):
        lookup_asm(torch.float32)
