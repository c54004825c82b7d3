"""The 4-bit lookup's PTX (``four_bit_lookup``), run here by a small interpreter of the
instructions it uses: every byte of codes must come out as its two values times their
activations, whatever the codes, the values and the activations. A GPU runs the same text in
``quant_gemv_kernel.four_bit_row`` (measured by ``loadtests.quant_kernels``)."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast.four_bit_lookup import lookup_asm, table_words

# bitsandbytes' NF4 and FP4 values (``bitsandbytes.functional.get_4bit_type``).
NF4 = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)  # fmt: skip
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


def _run(asm: str, word: int, pairs: list[int], dtype: torch.dtype) -> list[float]:
    """The outputs ``$0``-``$3`` of ``asm`` for the codes ``word`` and activations ``pairs``."""
    regs: dict[str, int] = {"$4": word} | {f"${5 + i}": p for i, p in enumerate(pairs)}

    def value(operand: str) -> int:
        if operand in regs:
            return regs[operand]
        return int(operand, 0)

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
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
        elif op in ("mul.rn.f16x2", "fma.rn.bf16x2"):
            kind = torch.bfloat16 if "bf16" in op else torch.float16
            a, b = _halves(v[0], kind), _halves(v[1], kind)
            c = _halves(v[2], kind) if len(v) > 2 else [0.0, 0.0]
            # Products of two 16-bit values are exact in float64, so one rounding is RN's.
            regs[d] = _pair([a[i] * b[i] + c[i] for i in range(2)], kind)
        elif op == "cvt.f32.f16":
            regs[d] = _bits32(_halves(v[0], torch.float16)[0])
        elif op == "add.f32":
            total = torch.tensor(_f32(v[0]), dtype=torch.float32) + _f32(v[1])
            regs[d] = _bits32(float(total))
        else:
            raise AssertionError(f"the interpreter lacks {op}")
    return [_f32(regs[f"${i}"]) for i in range(4)]


def _expected(
    values: tuple[float, ...], word: int, pairs: list[int], dtype: torch.dtype
) -> list[float]:
    """Each byte's first input (its high code) times its pair's low half plus its second (low
    code) times the high half, each product rounded to ``dtype``, summed in float32."""
    table = torch.tensor(values, dtype=torch.float32).to(dtype).float().tolist()
    sums = []
    for k in range(4):
        byte = word >> 8 * k & 0xFF
        x = _halves(pairs[k], dtype)
        products = _halves(_pair([table[byte >> 4] * x[0], table[byte & 15] * x[1]], dtype), dtype)
        total = torch.tensor(products[0], dtype=torch.float32) + products[1]
        sums.append(float(total))
    return sums


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
def test_every_byte_is_its_two_values_times_their_activations(
    values: tuple[float, ...], word: int, activations: list[float], dtype: torch.dtype
) -> None:
    pairs = [_pair(activations[2 * i : 2 * i + 2], dtype) for i in range(4)]
    assert _run(lookup_asm(values, dtype), word, pairs, dtype) == _expected(
        values, word, pairs, dtype
    )


def test_every_code_is_looked_up_in_both_halves_of_a_word() -> None:
    """All 256 bytes in every position: the codes 8-15 (the second table word) included."""
    pairs = [_pair([1.0, 1.0], torch.float16)] * 4
    for byte in range(256):
        word = byte * 0x01010101
        got = _run(lookup_asm(NF4, torch.float16), word, pairs, torch.float16)
        assert got == _expected(NF4, word, pairs, torch.float16)


def test_table_words_hold_low_and_high_bytes_four_values_a_word() -> None:
    low, high = table_words([float(i) for i in range(16)], torch.float16)
    bits = torch.arange(16, dtype=torch.float16).view(torch.int16).tolist()
    for i, b in enumerate(bits):
        assert low[i // 4] >> 8 * (i % 4) & 0xFF == b & 0xFF
        assert high[i // 4] >> 8 * (i % 4) & 0xFF == (b >> 8) & 0xFF


def test_a_table_of_other_than_16_values_or_a_32_bit_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="16 values"):
        table_words([0.0] * 15, torch.float16)
    with pytest.raises(ValueError, match="16-bit"):
        lookup_asm(NF4, torch.float32)
