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
