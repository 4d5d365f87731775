"""The time model's assumptions, as every report prints them: one line per rule, written from the
constants the rules use (``time_model``, ``collective_time``, neuronsim's tables)."""

from __future__ import annotations

from neuronsim import hardware as hw
from neuronsim import tensor_engine as _te

from . import collective_time as _collective_time
from . import time_model as _time_model

# The tile shapes are the same on every Trainium generation (tests/readiness/test_tiles.py).
TILES = hw.CHIPS["trn2"]

ASSUMPTIONS = (
    "Each op runs alone on one logical NeuronCore: time = fixed + max(compute, memory).",
    "compute: matmul-like ops (those torch.utils.flop_counter has a formula for, and attention, "
    "which the simulator runs as the CPU flash kernel, with its device form's FLOPs) at the Tensor "
    "Engine's dense peak for their input dtype (float32 at the FP32 rate, or TF32 when "
    "torch.set_float32_matmul_precision allows it), for the tiles they occupy: the contraction "
    f"dimension in tiles of {TILES.partitions} partitions, the stationary operand in tiles of "
    f"{TILES.gemm_stationary_fmax} columns, the moving one streamed in tiles of up to "
    f"{TILES.gemm_moving_fmax} columns at one column per cycle and at least {_te.MM_INIT_LATENCY} "
    "cycles per instruction (NKI architecture guides), a partial tile costing a full one, the "
    "cheaper of the two layouts (convolutions: at their FLOPs), at "
    f"{_time_model.TENSOR_ENGINE_EFFICIENCY:.1%} of that rate: what AWS measured its best NKI matmul to reach "
    "(BF16 [4096, 8192] @ [8192, 8192] in 6.97 ms on one trn1 NeuronCore, the NKI matmul tutorial), against "
    "this rule's time for it; the only such measurement, applied to every chip. Other ops at the Vector "
    "Engine rate, one operation per element read or written.",
    "memory: every input is read and every output written once from HBM, at the core's share of "
    "the chip's HBM bandwidth or its DMA engines' sustained rate, whichever is lower, times the "
    "throughput AWS measured for a transfer of that many bytes per partition over 128 partitions "
    "(relative to a saturating one: 10% at 256 B per partition, 81% at 2 KiB, 97% at 4 KiB; "
    "'Introduction to DMA with NKI'), each operand taken as the op's mean; eager ops are not fused "
    "and reuse nothing across ops.",
    "torch.compile: each run of a compiled graph is timed whole from the ATen graph Inductor "
    "compiled (the ATen ops its generated code calls are not counted again): its matmul-like "
    "nodes as the ops above; all its other nodes as one fused kernel that keeps intermediates "
    "on chip, reading the graph inputs and matmul results it uses and writing the graph outputs "
    "and matmul operands it produces once each (one DMA transfer each), with one Vector Engine "
    "operation per element each node reads or writes; an in-place update of part of a graph input (a "
    "static KV cache's) moves only the values it writes. A graph compiled for dynamic shapes, or "
    "loaded whole from AOTAutograd's cache before the report started, is timed instead by the "
    "ATen ops its code calls (matmuls): a lower bound.",
    "fixed: one DMA transfer per operand at the published ~1.3 us fixed cost, plus the Tensor "
    f"Engine's ramp from {hw.TENSOR_ENGINE_RAMP_START:.0%} to full speed over ~{hw.TENSOR_ENGINE_RAMP_S * 1e6:g} us "
    "before each matmul.",
    "Views cost nothing. Ops that would fall back to CPU are timed as if native; their host "
    "round trip is not modelled.",
    *_collective_time.assumptions(),
    "pipeline parallelism (torch.distributed.pipelining): a step follows its schedule's own order of "
    "actions on every rank of the pipeline, for every micro-batch the script asked for; each action "
    "takes its stage's time for one micro-batch (its forward, backward, or their halves, as recorded) "
    "and starts when its rank is free and what it needs is done (the previous stage's forward of the "
    "micro-batch, the next stage's backward), plus a send's time between ranks; the step is when the "
    "last action ends, plus each rank's work outside the schedule (the optimizer step). The time ranks "
    "wait is the pipeline bubble.",
    "Ops on host (CPU) tensors are not timed. Engines do not overlap one op with the next.",
    "overlap: collectives run on the chip's collective-communication cores, apart from the compute "
    "engines (AWS's page on compute-communication overlap). One the script waits for where it is "
    "issued (async_op=False on the default stream, and functional collectives, as DTensor's tensor "
    "and sequence parallelism issue them) adds its whole time; asynchronous ones (async_op=True, as "
    "DDP's gradient buckets, or issued on another stream, as FSDP2's all-gathers and "
    "reduce-scatters) run while the step's compute does, and only what exceeds that compute adds. "
    "Contention between collectives and compute for the DMA engines, which AWS describes without a "
    "figure (round-robin between rings at packet boundaries, 4 KiB compute packets against 64 KiB "
    "collective ones), is not modelled: with asynchronous collectives the estimate is a lower bound, "
    "and the step with none of them overlapped (their whole time added) the upper bound the report "
    "prints beside it.",
    "generation (no optimizer step): each top-level forward (or call of a callable torch.compile "
    "made during the recording, its graphs timed whole) and the ops up to the next one are "
    "timed as above; a prefill is a forward without the previous one's KV cache, a decode step "
    "one with it and one token per sequence; each phase is the median of its forwards. A KV cache "
    "costs what its ops move: a static cache's in-place update only the rows it writes.",
    "A chip for which AWS publishes no figure the model needs is not estimated; its line says "
    "which figure is missing.",
)


def approximations(recordings: list) -> list:
    """Assumption lines for what these recordings hold that the model only approximates."""
    kinds = sorted(
        {
            c.kind
            for r in recordings
            for b in r.buckets + r.generation.forwards
            for c in b.collectives
            if _collective_time.is_approximated(c.kind)
        }
    )
    if not kinds:
        return []
    return [f"approximated: {', '.join(kinds)} (no formula for them here; each timed as an all-gather of its bytes)."]
