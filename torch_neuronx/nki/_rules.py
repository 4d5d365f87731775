"""NeuronCore hardware limits and the checks that enforce them.

Figures (one physical NeuronCore; an NKI kernel's instruction stream runs on one):
- 128 SBUF/PSUM partitions; PSUM 16 KiB per partition in 8 banks of 2 KiB, so a PSUM
  tile holds at most 512 fp32 per partition (nki.language.tile_size: pmax,
  psum_fmax, psum_num_banks).
- Matmul: stationary free size <= 128, moving free size <= 512, contraction
  (partition) <= 128; inputs fp8/bf16/fp16/tf32/fp32, accumulation and PSUM output
  fp32 (nki.isa.nc_matmul docs; NeuronCore-v4 can also write bf16).
- SBUF: 28 MiB on NeuronCore-v3 (trn2), 32 MiB on NeuronCore-v4 (trn3)
  ("Trainium3 Architecture Guide for NKI": "SBUF capacity is 32MiB (up from 28 MiB
  in NeuronCore-v3), while the PSUM capacity remains the same"); PSUM 2 MiB.
"""

from dataclasses import dataclass

from . import _dtypes as dt
from ._errors import (NKIBufferError, NKIDtypeError, NKIPartitionError, NKIShapeError,
                      NKITileSizeError, _fail)

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Hardware:
    """Per-NeuronCore limits and throughput figures used by rules and cost model."""

    name: str
    nc_version: str
    pmax: int
    sbuf_bytes: int
    psum_bytes: int
    psum_num_banks: int
    gemm_stationary_fmax: int
    gemm_moving_fmax: int
    psum_out_dtypes: tuple
    # --- cost model figures (see _cost_model.py for sources) ---
    tensor_bf16_flops: float  # dense BF16/FP16/TF32 FLOP/s of one core's Tensor Engine
    tensor_fp32_flops: float  # dense FP32 FLOP/s of one core's Tensor Engine
    hbm_bytes_per_s: float  # per-core share of chip HBM bandwidth
    engine_hz: float  # Vector/Scalar/GpSimd instruction clock (assumption, see cost model)
    cores_per_chip: int = 8

    @property
    def sbuf_partition_bytes(self):
        return self.sbuf_bytes // self.pmax

    @property
    def psum_partition_bytes(self):
        return self.psum_bytes // self.pmax

    @property
    def psum_bank_bytes(self):
        return self.psum_partition_bytes // self.psum_num_banks

    @property
    def psum_fmax(self):
        return self.psum_bank_bytes // 4


# Trainium2 chip: 8 NeuronCore-v3, 667 dense BF16 TFLOPS, 181 FP32 TFLOPS, HBM 2.9 TB/s
# ("Trainium2 Architecture" and "Trainium2 Architecture Guide for NKI", AWS Neuron docs).
TRN2 = Hardware(
    name="trn2", nc_version="v3", pmax=128, sbuf_bytes=28 * MiB, psum_bytes=2 * MiB,
    psum_num_banks=8, gemm_stationary_fmax=128, gemm_moving_fmax=512,
    psum_out_dtypes=(dt.float32,),
    tensor_bf16_flops=667e12 / 8, tensor_fp32_flops=181e12 / 8,
    hbm_bytes_per_s=2.9e12 / 8, engine_hz=1.4e9,
)
# Trainium3 chip: 8 NeuronCore-v4, 671 dense BF16 TFLOPS, 183 FP32 TFLOPS, HBM 4.9 TB/s
# ("Trainium3 Architecture", AWS Neuron docs; the NKI trn3 guide quotes 4.7 TB/s).
TRN3 = Hardware(
    name="trn3", nc_version="v4", pmax=128, sbuf_bytes=32 * MiB, psum_bytes=2 * MiB,
    psum_num_banks=8, gemm_stationary_fmax=128, gemm_moving_fmax=512,
    psum_out_dtypes=(dt.float32, dt.bfloat16),
    tensor_bf16_flops=671e12 / 8, tensor_fp32_flops=183e12 / 8,
    hbm_bytes_per_s=4.9e12 / 8, engine_hz=1.4e9,
)
HARDWARE = {"trn2": TRN2, "trn3": TRN3}


def get_hardware(target):
    """Resolve ``"trn2"`` / ``"trn3"`` / a :class:`Hardware` to a :class:`Hardware`."""
    if isinstance(target, Hardware):
        return target
    if target is None:
        return TRN2
    try:
        return HARDWARE[str(target).lower()]
    except KeyError:
        raise ValueError(f"unknown platform_target {target!r}; expected one of "
                         f"{sorted(HARDWARE)}") from None


MATMUL_INPUT_DTYPES = (dt.float8_e4m3, dt.float8_e5m2, dt.bfloat16, dt.float16,
                       dt.tfloat32, dt.float32)


def check_partition(hw, instr, operand, shape, pdim=0):
    """Partition dimension of an on-chip tile must be <= pmax (128)."""
    if len(shape) > pdim and shape[pdim] > hw.pmax:
        _fail(NKIPartitionError, instr, operand,
              f"partition dimension {shape[pdim]} (shape {tuple(shape)}) exceeds the "
              f"{hw.pmax}-partition limit (nl.tile_size.pmax={hw.pmax})")


def check_on_chip(instr, operand, t, allowed=("sbuf", "psum")):
    """Compute engines read/write SBUF or PSUM only; DMA moves HBM <-> SBUF."""
    if t.buffer not in allowed:
        names = " or ".join(a.upper() for a in allowed)
        hint = " (use nl.load / nl.store or nisa.dma_copy to move data)" \
            if t.buffer in ("hbm", "shared_hbm") else ""
        _fail(NKIBufferError, instr, operand,
              f"tensor in {t.buffer.upper()} but this instruction accesses {names} only{hint}")


def check_matmul(hw, instr, stationary_shape, moving_shape, st_dtype, mv_dtype,
                 names=("stationary", "moving")):
    """Tensor Engine layout: K (partition) <= 128, stationary free <= 128, moving free <= 512."""
    st, mv = names
    for name, d in ((st, st_dtype), (mv, mv_dtype)):
        if d not in MATMUL_INPUT_DTYPES:
            _fail(NKIDtypeError, instr, name,
                  f"dtype {d!r} not accepted by the Tensor Engine (accepts "
                  f"{', '.join(x.name for x in MATMUL_INPUT_DTYPES)})")
    for name, shape in ((st, stationary_shape), (mv, moving_shape)):
        if len(shape) != 2:
            _fail(NKIShapeError, instr, name,
                  f"matmul operands must be 2-D [partition, free] tiles, got {tuple(shape)}")
        check_partition(hw, instr, name, shape)
    if stationary_shape[0] != moving_shape[0]:
        _fail(NKITileSizeError, instr, mv,
              f"contraction (partition) size {moving_shape[0]} differs from {st}'s "
              f"{stationary_shape[0]}")
    if stationary_shape[1] > hw.gemm_stationary_fmax:
        _fail(NKITileSizeError, instr, st,
              f"free size {stationary_shape[1]} exceeds the stationary limit "
              f"{hw.gemm_stationary_fmax} (nl.tile_size.gemm_stationary_fmax)")
    if moving_shape[1] > hw.gemm_moving_fmax:
        _fail(NKITileSizeError, instr, mv,
              f"free size {moving_shape[1]} exceeds the moving limit "
              f"{hw.gemm_moving_fmax} (nl.tile_size.gemm_moving_fmax)")


def check_psum_tile(hw, instr, operand, shape, dtype, pdim=0):
    """One PSUM tile must fit a 2 KiB bank per partition (512 fp32)."""
    free = 1
    for i, s in enumerate(shape):
        if i > pdim:
            free *= s
    nbytes = free * dtype.itemsize
    if nbytes > hw.psum_bank_bytes:
        _fail(NKITileSizeError, instr, operand,
              f"PSUM tile {tuple(shape)} {dtype.name} uses {nbytes} bytes per partition; "
              f"a PSUM bank holds {hw.psum_bank_bytes} bytes per partition "
              f"(nl.tile_size.psum_fmax={hw.psum_fmax} fp32)")


def check_psum_dtype(hw, instr, operand, dtype):
    if dtype not in hw.psum_out_dtypes:
        _fail(NKIDtypeError, instr, operand,
              f"Tensor Engine writes {'/'.join(d.name for d in hw.psum_out_dtypes)} to PSUM on "
              f"{hw.name}, got {dtype.name}")


def check_free_axes(instr, operand, axis, ndim):
    """Vector/Scalar reductions run along free axes only (axis 0 is the partition)."""
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        a = a + ndim if a < 0 else a
        if a == 0:
            _fail(NKIShapeError, instr, operand,
                  "reduction along the partition axis (axis 0) is not supported by the "
                  "Vector/Scalar engines; reduce along free axes, transpose first, or use "
                  "nisa.tensor_partition_reduce")
        if a >= ndim:
            _fail(NKIShapeError, instr, operand, f"axis {a} out of range for a {ndim}-D tile")

