"""The Tensor Engine's matmul rules: the one model of them that the NKI cost model and the
readiness time model share.

From AWS's "Trainium2 Architecture Guide for NKI" and the NKI programming guide: the engine is a
128 x 128 systolic array. One ``nc_matmul`` holds a *stationary* tile (contraction dimension K on
the partitions, at most ``partitions`` = 128, by at most ``gemm_stationary_fmax`` = 128 columns)
and streams a *moving* tile (the same K by at most ``gemm_moving_fmax`` = 512 columns) through
it, one column per cycle. A tile that fills fewer partitions or stationary columns occupies the
array all the same. Each instruction costs at least ``MM_INIT_LATENCY`` cycles (the
NeuronCore-v2 guide's figure; AWS publishes none for v3/v4, so using it there is an assumption).

Pure Python: the NKI simulator reads it without torch.
"""

from __future__ import annotations

MM_INIT_LATENCY = 64  # TensorE cycles per matmul instruction, at least


def instruction_cycles(moving_free: int) -> int:
    """Cycles of one matmul instruction that streams `moving_free` columns."""
    return max(moving_free, MM_INIT_LATENCY)


def _cycles(chip, m: int, k: int, n: int) -> int:
    """[m, k] @ [k, n] with the [k, m] operand stationary and [k, n] moving."""
    k_tiles = -(-k // chip.partitions)
    m_tiles = -(-m // chip.gemm_stationary_fmax)
    full, rest = divmod(n, chip.gemm_moving_fmax)
    per_row = full * instruction_cycles(chip.gemm_moving_fmax) + (instruction_cycles(rest) if rest else 0)
    return k_tiles * m_tiles * per_row


def matmul_cycles(chip, m: int, k: int, n: int) -> int:
    """Tensor Engine cycles of one [m, k] @ [k, n] matmul on one physical core, tiled as above;
    of the two ways to lay it out (which operand is stationary), the cheaper, as a compiler would."""
    if min(m, k, n) <= 0:
        return 0
    return min(_cycles(chip, m, k, n), _cycles(chip, n, k, m))


def occupancy(chip, matmuls) -> float:
    """How many times the ideal time the tiles of `matmuls` ([(m, k, n, count)]) take: 1.0 when
    every dimension fills its tiles, more when narrow shards or short sequences leave the array
    partly idle. Ideal: m k n / (partitions x stationary columns) cycles, the dense peak."""
    ideal = sum(c * m * k * n for m, k, n, c in matmuls) / (chip.partitions * chip.gemm_stationary_fmax)
    if not ideal:
        return 1.0
    return sum(c * matmul_cycles(chip, m, k, n) for m, k, n, c in matmuls) / ideal
