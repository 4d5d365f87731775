"""First-order Trainium cost model for simulated NKI instructions and PyTorch ops.

Every instruction is charged to the engine that executes it:

- Tensor Engine (nc_matmul, nc_transpose on PE): a 128x128 systolic array streams the
  moving tile one column (free element) per cycle. The cycle rate is derived from the
  published dense BF16 throughput of one NeuronCore: f = FLOPS / (2 * 128 * 128)
  (trn2: 667 TFLOPS / 8 cores -> 2.54 GHz column rate). FP32 inputs stream at the
  published FP32/BF16 ratio (181/667 on trn2). Partial tiles (K or M < 128) cost as
  much as a full tile: the array is occupied either way.
- Vector / Scalar / GpSimd engines: all 128 partitions in parallel, one element per
  partition per cycle, plus a fixed per-instruction overhead. The engine clock is an
  ASSUMPTION (1.4 GHz, the NeuronCore clock quoted for earlier generations); AWS does
  not publish per-engine clocks for NeuronCore-v3/v4. GpSimd has 8 cores x 16 fp32
  lanes (512-bit SIMD) so it processes 128 elements per cycle over all partitions.
- DMA: bytes / per-core HBM bandwidth (chip bandwidth / 8 cores: trn2 2.9 TB/s,
  trn3 4.9 TB/s, AWS "Trainium2/3 Architecture" pages) plus a fixed descriptor
  overhead.

Engines run concurrently, so the kernel estimate is the busiest engine's time
(perfect overlap: a lower bound; the serial sum is reported as an upper bound). The
bound is "memory" when DMA is the busiest engine, else "compute (<engine>)".
Not modelled: dependencies/semaphore stalls, DMA queue parallelism limits, SBUF bank
conflicts, bf16 fast modes of the Vector engine, HBM page effects, LNC=2 sharding.
"""

from collections import defaultdict
from dataclasses import dataclass, field

ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")
FIXED_OVERHEAD_CYCLES = 64  # per compute instruction (issue + pipeline fill), assumption
DMA_FIXED_S = 64 / 1.4e9  # per DMA instruction descriptor overhead, assumption
PE_ROWS = PE_COLS = 128
GPSIMD_ELEMS_PER_CYCLE = 8 * 16


def tensor_column_hz(hw, fp32=False):
    """Columns per second the 128x128 PE array streams for one matmul."""
    flops = hw.tensor_fp32_flops if fp32 else hw.tensor_bf16_flops
    return flops / (2 * PE_ROWS * PE_COLS)


def matmul_seconds(hw, moving_free, fp32=False):
    """Time of one nc_matmul: moving free size columns + fixed overhead."""
    hz = tensor_column_hz(hw, fp32)
    return (moving_free + FIXED_OVERHEAD_CYCLES) / hz


def elementwise_seconds(hw, engine, partitions, free_elems):
    """Time of one Vector/Scalar/GpSimd instruction over a [partitions, free] tile."""
    if engine == "GpSimd":
        cycles = -(-partitions * free_elems // GPSIMD_ELEMS_PER_CYCLE)
    else:
        cycles = free_elems  # 128 partition lanes work in parallel
    return (cycles + FIXED_OVERHEAD_CYCLES) / hw.engine_hz


def dma_seconds(hw, nbytes):
    """Time of one DMA transfer between HBM and SBUF."""
    return nbytes / hw.hbm_bytes_per_s + DMA_FIXED_S


@dataclass
class CostReport:
    """Estimated device time of one kernel launch (or op sequence) on one NeuronCore."""

    hardware: str
    engine_busy_s: dict
    instructions: dict
    hbm_bytes: int
    flops: float
    sbuf_peak_bytes_per_partition: int = 0
    psum_peak_banks: int = 0
    n_programs: int = 1
    by_instruction: dict = field(default_factory=dict)

    @property
    def total_time_s(self):
        """Estimated device time: busiest engine (engines overlap perfectly)."""
        return max(self.engine_busy_s.values()) if self.engine_busy_s else 0.0

    @property
    def serial_time_s(self):
        """Upper bound: no overlap between engines."""
        return sum(self.engine_busy_s.values())

    @property
    def total_time_us(self):
        return self.total_time_s * 1e6

    @property
    def busiest_engine(self):
        return max(self.engine_busy_s, key=self.engine_busy_s.get)

    @property
    def bound(self):
        """``"memory"`` if DMA dominates, else ``"compute (<engine>)"``."""
        e = self.busiest_engine
        return "memory" if e == "DMA" else f"compute ({e})"

    def __str__(self):
        lines = [f"NKI cost estimate on {self.hardware} (one NeuronCore): "
                 f"{self.total_time_us:.2f} us, {self.bound}-bound"]
        for e in ENGINES:
            busy = self.engine_busy_s.get(e, 0.0)
            pct = 100 * busy / self.total_time_s if self.total_time_s else 0.0
            lines.append(f"  {e:<7} {busy * 1e6:10.2f} us  {pct:5.1f}%  "
                         f"{self.instructions.get(e, 0):6d} instr")
        lines.append(f"  HBM traffic {self.hbm_bytes / 1e6:.3f} MB, {self.flops / 1e9:.3f} GFLOP,"
                     f" serial upper bound {self.serial_time_s * 1e6:.2f} us")
        if self.sbuf_peak_bytes_per_partition or self.psum_peak_banks:
            lines.append(f"  peak SBUF {self.sbuf_peak_bytes_per_partition} B/partition, "
                         f"peak PSUM {self.psum_peak_banks} banks")
        return "\n".join(lines)


class CostLedger:
    """Accumulates engine busy time while a kernel runs."""

    def __init__(self, hw):
        self.hw = hw
        self.busy = defaultdict(float)
        self.count = defaultdict(int)
        self.by_instr = defaultdict(float)
        self.hbm_bytes = 0
        self.flops = 0.0

    def charge(self, engine, instr, seconds, hbm_bytes=0, flops=0.0):
        self.busy[engine] += seconds
        self.count[engine] += 1
        self.by_instr[instr] += seconds
        self.hbm_bytes += hbm_bytes
        self.flops += flops

    def report(self, sbuf_peak=0, psum_peak=0, n_programs=1):
        return CostReport(hardware=self.hw.name,
                          engine_busy_s={e: self.busy.get(e, 0.0) for e in ENGINES},
                          instructions={e: self.count.get(e, 0) for e in ENGINES},
                          hbm_bytes=self.hbm_bytes, flops=self.flops,
                          sbuf_peak_bytes_per_partition=sbuf_peak, psum_peak_banks=psum_peak,
                          n_programs=n_programs, by_instruction=dict(self.by_instr))
