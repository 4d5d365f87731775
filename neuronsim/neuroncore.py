"""The costs of one NeuronCore's DMA and Vector Engine: the one rule set that the NKI cost model
(``neuronsim.nki._cost_model``, per instruction) and the readiness time model (per PyTorch op)
share, as ``tensor_engine`` is for the Tensor Engine. Figures come from the hardware table.

**DMA.** Every transfer pays a fixed cost, then moves its bytes at the core's rate (the lower of
its HBM share and its DMA engines): "every DMA transfer incurs descriptor setup, synchronization,
and semaphore-to-start latency (~1300 ns cross-engine)" (AWS, "Guideline to Avoid Under-Utilizing
DMA Bandwidth"). Independent transfers issued on different queues overlap their fixed costs.
Where the two models use this differently, and why:

- an NKI kernel issues each ``dma_copy`` itself, and a kernel written for the hardware spreads
  independent ones over the core's 16 DMA engines: the NKI model charges each one sixteenth of
  the fixed cost (its stated assumption: perfect overlap, a lower bound);
- a PyTorch op the readiness model times runs as its own launch, whose input and output
  transfers the runtime sets up and synchronises one after another around the op's compute: it
  charges each operand the whole fixed cost (``queues=1``).

Between the fixed cost and the rate, a transfer's bytes move at the fraction of the rate AWS
measured for its bytes per partition (``dma_efficiency``; 128 partitions assumed): the readiness
model charges it per operand, as the runtime moves each in one transfer; the NKI model times each
``dma_copy`` at the full rate (its lower bound again), as AWS's kernels keep transfers at 4 KiB
per partition or more, where the measured curve is within 4% of it.

**Vector Engine.** AWS publishes its throughput two ways: the data-path width per cycle (256
elements of 32-bit data, 512 when every operand is BF16/FP16, on trn2/trn3: the architecture
guides' engine tables) at the engine's clock, which the NKI model charges per instruction; and the
engine's FP32 FLOP/s per core (the NeuronCore pages: 1.0 TFLOPS on trn2), which the readiness
model charges per element an op reads or writes, whatever its dtype. The two figures differ by
about 4x. Readiness's eager ops move every element through HBM, whose share per core (about 360
GB/s on trn2, a few bytes per element) bounds them at well under either rate, so their estimate
is memory-bound either way; the choice matters for a compiled graph's fused kernel, whose
intermediates stay on chip.
"""

from __future__ import annotations

import bisect

from . import measured as _measured


def dma_efficiency(transfer_bytes: float, partitions: int = 128) -> float:
    """The fraction of the DMA engines' peak a transfer of `transfer_bytes` over `partitions`
    partitions achieves (``measured``): AWS's measured throughput by bytes per partition, relative
    to a saturating transfer (32 KiB per partition and above: the sustained rate). Below the
    smallest size measured it stays at that size's: the transfer's fixed cost, charged apart
    (``dma_fixed_seconds``), is what a tiny transfer costs."""
    curve = _measured.DMA_BYTES_PER_PARTITION_CURVE
    per_partition = transfer_bytes / partitions
    sizes = [b for b, _ in curve]
    if per_partition <= sizes[0]:
        relative = curve[0][1]
    elif per_partition >= sizes[-1]:
        relative = curve[-1][1]
    else:
        i = bisect.bisect_left(sizes, per_partition)
        (b0, r0), (b1, r1) = curve[i - 1], curve[i]
        relative = r0 + (per_partition - b0) / (b1 - b0) * (r1 - r0)
    return relative


def dma_fixed_seconds(fixed_s: float, transfers: int, queues: int = 1) -> float:
    """The fixed cost of `transfers` independent DMA transfers issued on `queues` queues that
    overlap their fixed costs (1: one after another)."""
    return fixed_s * transfers / queues


def dma_seconds(nbytes: int, bytes_per_s: float, fixed_s: float, transfers: int = 1, queues: int = 1) -> float:
    """`nbytes` moved by `transfers` transfers at `bytes_per_s`, with their fixed costs."""
    return nbytes / bytes_per_s + dma_fixed_seconds(fixed_s, transfers, queues)


def vector_cycles(elements: int, width_fp32: int, width_16bit: int, all_16bit: bool) -> int:
    """Vector Engine cycles to stream `elements` through its data path (all 128 lanes), at the
    published width for 32-bit data, or for BF16/FP16 input and output."""
    return -(-elements // (width_16bit if all_16bit else width_fp32))


def vector_element_seconds(elements: int, fp32_flops: float) -> float:
    """`elements` at the Vector Engine's published FP32 FLOP/s, one operation each (the per-op rule)."""
    return elements / fp32_flops
