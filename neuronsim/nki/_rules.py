"""NeuronCore hardware limits and the checks that enforce them.

Every figure comes from the one hardware table, ``neuronsim.hardware`` (sources
cited there): partitions, SBUF/PSUM sizes and banks, matmul tile limits, PSUM output
dtypes, engine clocks, Tensor Engine FLOP/s and HBM/DMA bandwidth. :class:`Hardware`
is the per-physical-NeuronCore view an NKI kernel sees (one instruction stream runs
on one physical core).
"""

from dataclasses import dataclass

from .. import hardware as _hardware
from .. import settings as _settings
from . import _dtypes as dt
from ._errors import NKIBufferError, NKIDtypeError, NKIPartitionError, NKIShapeError, NKITileSizeError, _fail

# Chips the NKI simulator models (NeuronCore-v3 and v4). trn1 (NeuronCore-v2) differs
# in SBUF size, engine clocks and instruction set, none of which is simulated.
NKI_CHIPS = ("trn2", "trn3")


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
    tensor_flops: dict  # dense FLOP/s of one core's Tensor Engine by input dtype name
    hbm_bytes_per_s: float  # per-core share of the chip's HBM bandwidth
    tensor_hz: float
    vector_hz: float
    scalar_hz: float
    gpsimd_hz: float
    vector_width_fp32: int  # Vector Engine elements/cycle (all lanes), 32-bit data
    vector_width_16bit: int  # ... with BF16/FP16 input and output
    dma_engines: int
    dma_bytes_per_s: float  # all DMA engines of one core together
    dma_fixed_s: float  # fixed cost of one DMA transfer
    cores_per_chip: int

    @property
    def tensor_bf16_flops(self):
        return self.tensor_flops["bfloat16"]

    @property
    def tensor_fp32_flops(self):
        return self.tensor_flops["float32"]

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

    def engine_hz(self, engine):
        """Clock of a compute engine ("Tensor", "Vector", "Scalar", "GpSimd")."""
        return {"Tensor": self.tensor_hz, "Vector": self.vector_hz, "Scalar": self.scalar_hz, "GpSimd": self.gpsimd_hz}[
            engine
        ]


def _from_chip(c):
    missing = [
        f
        for f in (
            "tensor_hz",
            "vector_hz",
            "scalar_hz",
            "gpsimd_hz",
            "vector_width_fp32",
            "dma_bytes_per_s_per_engine",
            "dma_fixed_s",
        )
        if getattr(c, f, None) is None
    ]
    if missing:
        raise NotImplementedError(
            f"the hardware table has no {', '.join(missing)} for " f"{c.name}; the NKI simulator cannot model it"
        )
    return Hardware(
        name=c.name,
        nc_version=c.nc_version,
        pmax=c.partitions,
        sbuf_bytes=c.sbuf_bytes,
        psum_bytes=c.psum_bytes,
        psum_num_banks=c.psum_banks,
        gemm_stationary_fmax=c.gemm_stationary_fmax,
        gemm_moving_fmax=c.gemm_moving_fmax,
        psum_out_dtypes=tuple(dt.as_dtype(n) for n in c.psum_out_dtypes),
        tensor_flops=dict(c.tensor_flops),
        hbm_bytes_per_s=c.hbm_bytes_per_s / c.physical_cores,
        tensor_hz=c.tensor_hz,
        vector_hz=c.vector_hz,
        scalar_hz=c.scalar_hz,
        gpsimd_hz=c.gpsimd_hz,
        vector_width_fp32=c.vector_width_fp32,
        vector_width_16bit=c.vector_width_16bit,
        dma_engines=c.dma_engines,
        dma_bytes_per_s=c.dma_bytes_per_s_per_engine * c.dma_engines,
        dma_fixed_s=c.dma_fixed_s,
        cores_per_chip=c.physical_cores,
    )


TRN2 = _from_chip(_hardware.CHIPS["trn2"])
TRN3 = _from_chip(_hardware.CHIPS["trn3"])
HARDWARE = {"trn2": TRN2, "trn3": TRN3}


def get_hardware(target=None):
    """Resolve ``"trn2"`` / ``"trn3"`` / a :class:`Hardware` to a :class:`Hardware`.

    ``None`` follows ``TORCH_NEURONX_INSTANCE_TYPE`` (default trn2.3xlarge).
    """
    if isinstance(target, Hardware):
        return target
    if target is None:
        name = _hardware.chip().name
        if name not in HARDWARE:
            raise NotImplementedError(
                f"TORCH_NEURONX_INSTANCE_TYPE={_settings.raw('TORCH_NEURONX_INSTANCE_TYPE')!r} "
                f"selects a {name} chip (NeuronCore-{_hardware.CHIPS[name].nc_version}); the NKI "
                f"simulator models {' and '.join(NKI_CHIPS)} only: choose a trn2 or trn3 "
                f"instance type, or pass platform_target='trn2'"
            )
        return HARDWARE[name]
    key = str(target).lower()
    if key in _hardware.CHIPS and key not in HARDWARE:
        raise NotImplementedError(
            f"platform_target {target!r} (NeuronCore-{_hardware.CHIPS[key].nc_version}) is not "
            f"simulated; the NKI simulator models {' and '.join(NKI_CHIPS)} only"
        )
    try:
        return HARDWARE[key]
    except KeyError:
        raise ValueError(f"unknown platform_target {target!r}; expected one of " f"{sorted(HARDWARE)}") from None


MATMUL_INPUT_DTYPES = (dt.float8_e4m3, dt.float8_e5m2, dt.bfloat16, dt.float16, dt.tfloat32, dt.float32)


def check_partition(hw, instr, operand, shape, pdim=0):
    """Partition dimension of an on-chip tile must be <= pmax (128)."""
    if len(shape) > pdim and shape[pdim] > hw.pmax:
        _fail(
            NKIPartitionError,
            instr,
            operand,
            f"partition dimension {shape[pdim]} (shape {tuple(shape)}) exceeds the "
            f"{hw.pmax}-partition limit (nl.tile_size.pmax={hw.pmax})",
        )


def check_on_chip(instr, operand, t, allowed=("sbuf", "psum")):
    """Compute engines read/write SBUF or PSUM only; DMA moves HBM <-> SBUF."""
    if t.buffer not in allowed:
        names = " or ".join(a.upper() for a in allowed)
        hint = " (use nl.load / nl.store or nisa.dma_copy to move data)" if t.buffer in ("hbm", "shared_hbm") else ""
        _fail(
            NKIBufferError,
            instr,
            operand,
            f"tensor in {t.buffer.upper()} but this instruction accesses {names} only{hint}",
        )


def check_matmul(hw, instr, stationary_shape, moving_shape, st_dtype, mv_dtype, names=("stationary", "moving")):
    """Tensor Engine layout: K (partition) <= 128, stationary free <= 128, moving free <= 512."""
    st, mv = names
    for name, d in ((st, st_dtype), (mv, mv_dtype)):
        if d not in MATMUL_INPUT_DTYPES:
            _fail(
                NKIDtypeError,
                instr,
                name,
                f"dtype {d!r} not accepted by the Tensor Engine (accepts "
                f"{', '.join(x.name for x in MATMUL_INPUT_DTYPES)})",
            )
    for name, shape in ((st, stationary_shape), (mv, moving_shape)):
        if len(shape) != 2:
            _fail(
                NKIShapeError, instr, name, f"matmul operands must be 2-D [partition, free] tiles, got {tuple(shape)}"
            )
        check_partition(hw, instr, name, shape)
    if stationary_shape[0] != moving_shape[0]:
        _fail(
            NKITileSizeError,
            instr,
            mv,
            f"contraction (partition) size {moving_shape[0]} differs from {st}'s " f"{stationary_shape[0]}",
        )
    if stationary_shape[1] > hw.gemm_stationary_fmax:
        _fail(
            NKITileSizeError,
            instr,
            st,
            f"free size {stationary_shape[1]} exceeds the stationary limit "
            f"{hw.gemm_stationary_fmax} (nl.tile_size.gemm_stationary_fmax)",
        )
    if moving_shape[1] > hw.gemm_moving_fmax:
        _fail(
            NKITileSizeError,
            instr,
            mv,
            f"free size {moving_shape[1]} exceeds the moving limit "
            f"{hw.gemm_moving_fmax} (nl.tile_size.gemm_moving_fmax)",
        )


def check_psum_tile(hw, instr, operand, shape, dtype, pdim=0):
    """One PSUM tile must fit a 2 KiB bank per partition (512 fp32)."""
    free = 1
    for i, s in enumerate(shape):
        if i > pdim:
            free *= s
    nbytes = free * dtype.itemsize
    if nbytes > hw.psum_bank_bytes:
        _fail(
            NKITileSizeError,
            instr,
            operand,
            f"PSUM tile {tuple(shape)} {dtype.name} uses {nbytes} bytes per partition; "
            f"a PSUM bank holds {hw.psum_bank_bytes} bytes per partition "
            f"(nl.tile_size.psum_fmax={hw.psum_fmax} fp32)",
        )


def check_psum_dtype(hw, instr, operand, dtype):
    if dtype not in hw.psum_out_dtypes:
        _fail(
            NKIDtypeError,
            instr,
            operand,
            f"Tensor Engine writes {'/'.join(d.name for d in hw.psum_out_dtypes)} to PSUM on "
            f"{hw.name}, got {dtype.name}",
        )


def check_free_axes(instr, operand, axis, ndim):
    """Vector/Scalar reductions run along free axes only (axis 0 is the partition)."""
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        a = a + ndim if a < 0 else a
        if a == 0:
            _fail(
                NKIShapeError,
                instr,
                operand,
                "reduction along the partition axis (axis 0) is not supported by the "
                "Vector/Scalar engines; reduce along free axes, transpose first, or use "
                "nisa.tensor_partition_reduce",
            )
        if a >= ndim:
            _fail(NKIShapeError, instr, operand, f"axis {a} out of range for a {ndim}-D tile")
