"""First-order Trainium cost model for simulated NKI instructions and PyTorch ops.

All figures come from the hardware table (``neuronsim.hardware``), which cites
AWS's "Trainium2/Trainium3 Architecture Guide for NKI" and architecture pages. Each
instruction is charged to the engine that executes it, as an *initiation interval*
(how soon the engine can start its next instruction), the cost model those guides use:

- Tensor Engine (nc_matmul, PE transpose): the 128x128 systolic array streams the
  moving tile one column (free element) per cycle at the Tensor clock (2.4 GHz on
  trn2/trn3; 2.4e9 x 128 x 128 x 2 = 79 TFLOPS, the published BF16 rate). Cost
  ``max(N, MM_INIT_LATENCY)`` cycles (``neuronsim.tensor_engine``, the rules the readiness
  time model shares), scaled by the published BF16/dtype FLOP ratio
  (FP32 79/20, i.e. the guide's "roughly 4x"). Partial tiles (K or M < 128) cost as
  much as a full tile: the array is occupied either way.
- Vector Engine: all 128 lanes in parallel, at the published data-path width (trn2/trn3:
  256 elements/cycle for 32-bit data, 512 when every operand is BF16/FP16), one pass
  per input tile (the guide: "roughly N cycles" for one input, "2N" for two), at the
  Vector clock (0.96 GHz trn2, 1.2 GHz trn3).
- Scalar Engine: 128 elements/cycle (one per lane) at 1.2 GHz.
- GpSimd Engine: 128 elements/cycle over all partitions at 1.2 GHz.
- A compute instruction occupies its engine at least ``ACCESS_OVERHEAD_CYCLES``.
- DMA: bytes moved to/from HBM / min(per-core HBM share, the core's 16 DMA engines),
  plus the table's fixed cost of one transfer divided by the 16 DMA queues that
  overlap independent transfers (``neuronsim.neuroncore``: the DMA and Vector Engine rules
  this model shares with the readiness time model, and why their uses differ).

Per-instruction overheads: ``MM_INIT_LATENCY`` (64 TensorE cycles) and the SBUF/PSUM
tensor access overhead (about 60 cycles) are the figures the Trainium/Inferentia2
architecture guide publishes for NeuronCore-v2; AWS publishes none for v3/v4, so using
them there is an ASSUMPTION. Overlapping the DMA fixed cost over the 16 queues is an
ASSUMPTION too.

Engines run concurrently, so the kernel estimate is the busiest engine's time
(perfect overlap: a lower bound; the serial sum is reported as an upper bound). The
bound is "memory" when DMA is the busiest engine, else "compute (<engine>)".
Not modelled: dependencies/semaphore stalls, SBUF bank conflicts, the Vector Engine's
2x/4x BF16 performance modes of select instructions, HBM page effects, LNC=2 sharding.
"""

import json
from collections import defaultdict
from dataclasses import dataclass, field

from .. import neuroncore
from ..tensor_engine import instruction_cycles

ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")
ACCESS_OVERHEAD_CYCLES = 60  # SBUF/PSUM access overhead (NeuronCore-v2 guide; assumed)
PE_ROWS = PE_COLS = 128
SCALAR_ELEMS_PER_CYCLE = 128  # "128 input/output" (Trainium2 guide's engine table)
GPSIMD_ELEMS_PER_CYCLE = 128  # "128 input/output for all data types" (Trainium3 guide)
_TENSOR_RATE_KEY = {
    "float32": "float32",
    "tfloat32": "tf32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float8_e4m3": "bfloat16",
    "float8_e5m2": "bfloat16",
}


def matmul_seconds(hw, moving_free, dtype_name="bfloat16"):
    """Time of one nc_matmul streaming ``moving_free`` columns of ``dtype_name`` inputs."""
    key = _TENSOR_RATE_KEY.get(dtype_name, "bfloat16")
    slowdown = hw.tensor_flops["bfloat16"] / hw.tensor_flops[key]
    return instruction_cycles(moving_free) * slowdown / hw.tensor_hz


def elementwise_seconds(hw, engine, partitions, free_elems, n_inputs=1, all_16bit=False):
    """Time of one Vector/Scalar/GpSimd instruction over ``n_inputs`` [partitions, free] tiles."""
    if engine == "Vector":
        elements = max(n_inputs, 1) * free_elems * hw.pmax
        cycles = neuroncore.vector_cycles(elements, hw.vector_width_fp32, hw.vector_width_16bit, all_16bit)
    elif engine == "GpSimd":
        cycles = -(-partitions * free_elems // GPSIMD_ELEMS_PER_CYCLE)
    else:  # Scalar: one element per lane per cycle
        cycles = -(-free_elems * hw.pmax // SCALAR_ELEMS_PER_CYCLE)
    return max(cycles, ACCESS_OVERHEAD_CYCLES) / hw.engine_hz(engine)


def dma_bytes_per_s(hw):
    """Sustained HBM<->SBUF bandwidth of one core: HBM share or DMA engines, the lower."""
    return min(hw.hbm_bytes_per_s, hw.dma_bytes_per_s)


def dma_seconds(hw, nbytes):
    """Time of one DMA transfer moving ``nbytes``."""
    return neuroncore.dma_seconds(nbytes, dma_bytes_per_s(hw), hw.dma_fixed_s, transfers=1, queues=hw.dma_engines)


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
    events: list = field(default_factory=list, repr=False)

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

    def chrome_trace(self):
        """The simulated engine timeline as a Chrome trace (``chrome://tracing``, Perfetto)."""
        tids = {e: i for i, e in enumerate(ENGINES)}
        events = [
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": tids[e],
                "args": {"name": f"{e} Engine" if e != "DMA" else "DMA queues"},
            }
            for e in ENGINES
        ]
        events += [
            {
                "name": instr,
                "cat": engine,
                "ph": "X",
                "pid": 0,
                "tid": tids[engine],
                "ts": start * 1e6,
                "dur": dur * 1e6,
            }
            for engine, instr, start, dur in self.events
        ]
        return {
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {"hardware": self.hardware, "estimate_us": self.total_time_us},
        }

    def save_chrome_trace(self, path):
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def __str__(self):
        lines = [
            f"NKI cost estimate on {self.hardware} (one NeuronCore): "
            f"{self.total_time_us:.2f} us, {self.bound}-bound"
        ]
        for e in ENGINES:
            busy = self.engine_busy_s.get(e, 0.0)
            pct = 100 * busy / self.total_time_s if self.total_time_s else 0.0
            lines.append(f"  {e:<7} {busy * 1e6:10.2f} us  {pct:5.1f}%  " f"{self.instructions.get(e, 0):6d} instr")
        lines.append(
            f"  HBM traffic {self.hbm_bytes / 1e6:.3f} MB, {self.flops / 1e9:.3f} GFLOP,"
            f" serial upper bound {self.serial_time_s * 1e6:.2f} us"
        )
        if self.sbuf_peak_bytes_per_partition or self.psum_peak_banks:
            lines.append(
                f"  peak SBUF {self.sbuf_peak_bytes_per_partition} B/partition, "
                f"peak PSUM {self.psum_peak_banks} banks"
            )
        return "\n".join(lines)


class CostLedger:
    """Accumulates engine busy time (and the per-engine timeline) while a kernel runs."""

    def __init__(self, hw):
        self.hw = hw
        self.busy = defaultdict(float)
        self.count = defaultdict(int)
        self.by_instr = defaultdict(float)
        self.events = []
        self.hbm_bytes = 0
        self.flops = 0.0

    def charge(self, engine, instr, seconds, hbm_bytes=0, flops=0.0):
        self.events.append((engine, instr, self.busy[engine], seconds))
        self.busy[engine] += seconds
        self.count[engine] += 1
        self.by_instr[instr] += seconds
        self.hbm_bytes += hbm_bytes
        self.flops += flops

    def report(self, sbuf_peak=0, psum_peak=0, n_programs=1):
        return CostReport(
            hardware=self.hw.name,
            engine_busy_s={e: self.busy.get(e, 0.0) for e in ENGINES},
            instructions={e: self.count.get(e, 0) for e in ENGINES},
            hbm_bytes=self.hbm_bytes,
            flops=self.flops,
            sbuf_peak_bytes_per_partition=sbuf_peak,
            psum_peak_banks=psum_peak,
            n_programs=n_programs,
            by_instruction=dict(self.by_instr),
            events=self.events,
        )
