"""The tiles of the batch kernels for bitsandbytes weights (``quant_gemv.rows`` for int8,
``quant_gemv.four_bit_matmul`` for 4-bit codes): the rows of activations, weight rows and inputs
a program takes for each batch, and how many programs share a weight's inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class MatmulConfig:
    """``rows``'s tiles: batch rows, weight rows and inputs per program and slice."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    # ``four_bit_matmul``'s programs over the inputs (each a share of them, their float32 sums
    # added after): ``four_bit_split``.
    splits: int = 1


# ``four_bit_matmul``'s tile past 64 rows (``four_bit_config``): 128 rows by 32 weight rows, a
# slice of 256 inputs (four 4-bit blocks of 64, one product for them all), the fastest of the
# sweep's tiles at 128 rows (docs/benchmarks.md, run 127; the 128-by-128 tile of the other
# batch products needs more shared memory than an H100 has at this slice).
WIDE_TILE = MatmulConfig(128, 32, 256, 8, 3)
# The fewest slices of a weight's inputs a split of ``four_bit_matmul``'s programs keeps
# (``four_bit_split``).
SPLIT_SLICES = 8
# Programs a batch product launches at least where its weight allows (``matmul_config``): two
# waves on the 132 multiprocessors of an H100 or H200, more on smaller cards (a T4's 40, an
# A10's 72), where narrower programs cost only the activations' reads again, from the cache.
# A constant rather than the device's count: the choice is traced into compiled steps.
MIN_PROGRAMS = 256
# The narrowest program (weight rows) for a batch of up to 64 rows: each program reads all the
# batch's activations again, and at 16 rows tiles of 16 weight rows measured slower than 32.
NARROWEST_SMALL = 32


def matmul_config(batch: int, outputs: int | None = None) -> MatmulConfig:
    """Tiles for a batch of ``batch`` rows: as few padded rows as the tensor cores allow (16)
    for a decode step, wider tiles that dequantize each slice for more rows as the batch grows;
    given the weight's ``outputs``, weight rows per program narrowed (down to the tensor cores'
    16, or ``NARROWEST_SMALL`` for the batches of up to 64 rows) until the grid has
    ``MIN_PROGRAMS``. A program covers all the inputs of its rows, so at 64 weight rows a
    program the 7B's output and down projections (4,096 outputs) ran 64 programs on 132
    multiprocessors; each weight is read once whatever the width."""
    if batch <= 16:
        chosen = MatmulConfig(16, 64, 128, 4, 3)
    elif batch <= 32:
        chosen = MatmulConfig(32, 64, 128, 4, 3)
    elif batch <= 64:
        chosen = MatmulConfig(64, 64, 128, 4, 3)
    else:
        chosen = MatmulConfig(128, 128, 64, 8, 3)
    block_n = chosen.block_n
    narrowest = NARROWEST_SMALL if batch <= 64 else 16
    while outputs is not None and block_n > narrowest and -(-outputs // block_n) < MIN_PROGRAMS:
        block_n //= 2
    return MatmulConfig(chosen.block_m, block_n, chosen.block_k, chosen.warps, chosen.stages)


def four_bit_config(batch: int, outputs: int) -> MatmulConfig:
    """``four_bit_matmul``'s tiles: ``matmul_config``'s with a slice of one 4-bit block for up
    to 64 rows (the tiles measured against the dequantized product, docs/benchmarks.md, run
    120); past them ``WIDE_TILE``, whose slice covers several blocks (each value scaled first),
    so that one product takes them all where the tensor cores' work grows with the rows."""
    if batch > 64:
        return WIDE_TILE
    return replace(matmul_config(batch, outputs), block_k=0)


def four_bit_split(
    config: MatmulConfig, batch: int, outputs: int, slices: int, programs: int
) -> MatmulConfig:
    """``config`` with its programs split over the weight's ``slices`` (``four_bit_matmul``'s
    loop), doubling the splits while the grid has fewer than ``programs`` and each split keeps
    at least ``SPLIT_SLICES`` slices: the 7B's output and down projections (4,096 outputs) give
    128 programs of 32 weight rows at up to 64 rows of activations, each reading all 4,096 or
    14,336 inputs a 4-bit block at a time, on 132 multiprocessors. ``WIDE_TILE`` is never split."""
    if config == WIDE_TILE:
        # Its slices span several blocks already; split, it was slower (docs/benchmarks.md,
        # run 136).
        return replace(config, splits=1)
    grid = -(-outputs // config.block_n) * -(-batch // config.block_m)
    splits = 1
    while grid * splits < programs and slices // (2 * splits) >= SPLIT_SLICES:
        splits *= 2
    return replace(config, splits=splits)
