"""Estimated time of a recorded run on real Trainium.

Each op is timed from its FLOPs and bytes (from its shapes and dtypes) by a
roofline on one logical NeuronCore's published figures (neuronsim/hardware.py,
the table the NKI cost model reads), plus the fixed costs a roofline leaves out;
each collective by a ring latency/bandwidth model of NeuronLink. ASSUMPTIONS is
printed in every report.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from neuronsim import hardware as hw
from neuronsim import tensor_engine as _te

from . import _collective_time
from ._collective_time import collective_time
from ._cost import TILES

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
    "cheaper of the two layouts (convolutions: at their FLOPs); other ops at the Vector Engine "
    "rate, one operation per element read or written.",
    "memory: every input is read and every output written once from HBM, at the core's share of "
    "the chip's HBM bandwidth or its DMA engines' peak, whichever is lower; eager ops are not "
    "fused and reuse nothing across ops.",
    "torch.compile: each run of a compiled graph is timed whole from the ATen graph Inductor "
    "compiled (the ATen ops its generated code calls are not counted again): its matmul-like "
    "nodes as the ops above; all its other nodes as one fused kernel that keeps intermediates "
    "on chip, reading the graph inputs and matmul results it uses and writing the graph outputs "
    "and matmul operands it produces once each (one DMA transfer each), with one Vector Engine "
    "operation per element each node reads or writes. A graph compiled for dynamic shapes, or "
    "loaded whole from AOTAutograd's cache before the report started, is timed instead by the "
    "ATen ops its code calls (matmuls): a lower bound.",
    "fixed: one DMA transfer per operand at the published ~1.3 us fixed cost, plus the Tensor "
    f"Engine's ramp from {hw.TENSOR_ENGINE_RAMP_START:.0%} to full speed over ~{hw.TENSOR_ENGINE_RAMP_S * 1e6:g} us "
    "before each matmul.",
    "Views cost nothing. Ops that would fall back to CPU are timed as if native; their host "
    "round trip is not modelled.",
    *_collective_time.assumptions(),
    "pipeline parallelism (benchmarks of published runs): a 1F1B schedule, as NeuronX Distributed "
    "runs it, over M micro-batches and P stages takes the sum of one micro-batch's forward and "
    "backward time on every stage plus (M - 1) times the slowest stage's (with equal stages, "
    "M + P - 1 micro-batch slots: the P - 1 slots are the pipeline bubble).",
    "Ops on host (CPU) tensors are not timed. Engines do not overlap one op with the next.",
    "overlap: collectives run on the chip's collective-communication cores, apart from the compute "
    "engines (AWS's page on compute-communication overlap). One the script waits for where it is "
    "issued (async_op=False on the default stream, and functional collectives, as DTensor's tensor "
    "and sequence parallelism issue them) adds its whole time; asynchronous ones (async_op=True, as "
    "DDP's gradient buckets, or issued on another stream, as FSDP2's all-gathers and "
    "reduce-scatters) run while the step's compute does, and only what exceeds that compute adds. "
    "Contention between collectives and compute for the DMA engines, which AWS describes without a "
    "figure, is not modelled: with asynchronous collectives the estimate is a lower bound.",
    "generation (no optimizer step): each top-level forward (or call of a callable torch.compile "
    "made during the recording, its graphs timed whole) and the ops up to the next one are "
    "timed as above; a prefill is a forward without the previous one's KV cache, a decode step "
    "one with it and one token per sequence; each phase is the median of its forwards. A KV cache "
    "costs what its ops move: a static cache's in-place update only the rows it writes.",
    "A chip for which AWS publishes no figure the model needs is not estimated; its line says "
    "which figure is missing.",
)

_RAMP_AVG = (1 + hw.TENSOR_ENGINE_RAMP_START) / 2


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


def _breakdown_entry(op: str, dtype: str) -> dict:
    """An empty row of the per-op breakdown (ops and collectives share the layout)."""
    return {
        "op": op,
        "dtype": dtype,
        "count": 0,
        "flops": 0,
        "bytes": 0,
        "seconds": 0.0,
        "fixed_seconds": 0.0,
        "compute_bound_calls": 0,
    }


_FIGURE_NAMES = {
    "vector_flops": "Vector Engine FLOP/s",
    "dma_bytes_per_s": "DMA bandwidth",
    "dma_fixed_s": "DMA fixed-cost",
    "neuronlink_bytes_per_s": "NeuronLink bandwidth",
}


def core_figures(chip: str, lnc: int, instance: str | None = None) -> dict:
    """The per-logical-core figures the model uses (and prints); `instance` may override NeuronLink."""
    spec = hw.CHIPS[chip]
    if lnc not in spec.lnc_allowed:
        raise ValueError(f"{chip} supports LNC={spec.lnc_allowed}, not LNC={lnc}")
    core = spec.per_core(lnc)
    inst = hw.INSTANCES[instance] if instance else None
    link = (inst.neuronlink_bytes_per_s if inst else None) or spec.neuronlink_bytes_per_s
    ranks = (inst.chips if inst else 1) * (spec.physical_cores // lnc)
    efa = inst.efa_bytes_per_s / ranks if inst and inst.efa_bytes_per_s else None
    have = {**core, "dma_fixed_s": spec.dma_fixed_s, "neuronlink_bytes_per_s": link}
    missing = [name for key, name in _FIGURE_NAMES.items() if have[key] is None]
    if missing:
        raise hw.MissingFigure(f"no estimate for {chip}: AWS publishes no {' or '.join(missing)} figure for it")
    return {
        "chip": chip,
        "lnc": lnc,
        "tensor_flops": dict(core["tensor_flops"]),
        "vector_flops": core["vector_flops"],
        "memory_bytes_per_s": min(core["hbm_bytes_per_s"], core["dma_bytes_per_s"]),
        "dma_fixed_s": spec.dma_fixed_s,
        "link_bytes_per_s": link * _collective_time.NEURONLINK_SEND_SHARE / (spec.physical_cores // lnc),
        **_intranode_figures(spec, lnc, instance),
        "efa_bytes_per_s": efa,  # per rank, when every rank of the instance talks off the instance at once
    }


def _intranode_figures(spec, lnc: int, instance: str | None) -> dict:
    """Ranks per chip and in the instance, where AWS publishes how collectives run inside one."""
    if spec.name not in hw.INTRANODE_CHIPS or not instance:
        return {"intranode_ranks": None}
    per_chip = spec.physical_cores // lnc
    return {"intranode_ranks": hw.INSTANCES[instance].chips * per_chip, "ranks_per_chip": per_chip}


def _tensor_rate(fig: dict, dtype: str, fp32_precision: str) -> float:
    rates = fig["tensor_flops"]
    if dtype in ("bfloat16", "float16"):
        return rates[dtype]
    if dtype.startswith("float8"):
        return rates["float8"]
    if dtype == "float32" and fp32_precision != "highest":
        return rates["tf32"]
    return rates["float32"]


def call_time(fig: dict, call, fp32_precision: str = "highest") -> tuple:
    """(seconds, {"fixed", "compute", "memory"}) of one :class:`OpCall` or :class:`GraphPart`."""
    return op_time(
        fig, call.kind, call.dtype, call.flops, call.bytes, call.operands, fp32_precision, call.tile_flops or None
    )


def op_time(
    fig: dict,
    kind: str,
    dtype: str,
    flops: int,
    nbytes: int,
    operands: int,
    fp32_precision: str = "highest",
    tile_flops: int | None = None,
) -> tuple:
    """(seconds, {"fixed", "compute", "memory"}) of one call; a Tensor Engine op's compute time is
    that of the FLOPs its tiles occupy the array for (`tile_flops`, when known)."""
    if kind == "view":
        return 0.0, {"fixed": 0.0, "compute": 0.0, "memory": 0.0}
    memory = nbytes / fig["memory_bytes_per_s"]
    fixed = operands * fig["dma_fixed_s"]
    if kind == "tensor":
        compute = (tile_flops or flops) / _tensor_rate(fig, dtype, fp32_precision)
        # The engine ramps from 50% speed: the first RAMP_S do RAMP_S * avg of the work.
        ramp_work = hw.TENSOR_ENGINE_RAMP_S * _RAMP_AVG
        fixed += min(compute, ramp_work) * (1 / _RAMP_AVG - 1)
    elif kind == "fused":  # a compiled graph's fused kernel: flops counts its vector operations
        compute = flops / fig["vector_flops"]
    else:
        itemsize = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
        compute = nbytes / itemsize / fig["vector_flops"]
    return fixed + max(compute, memory), {"fixed": fixed, "compute": compute, "memory": memory}


def _graph_dtype(parts: list) -> str:
    """A compiled graph's row is labelled with the dtype of its matmuls (else of its fused kernel)."""
    return next((p.dtype for p in parts if p.kind == "tensor"), parts[0].dtype if parts else "-")


def pipeline_seconds(stage_seconds: list, microbatches: int) -> float:
    """Forward and backward time of `microbatches` micro-batches through pipeline stages that
    take `stage_seconds` each per micro-batch, under a 1F1B schedule (see ASSUMPTIONS)."""
    if microbatches < 1 or not stage_seconds:
        raise ValueError(
            f"a pipeline needs at least one stage and one micro-batch, got {len(stage_seconds)} "
            f"stage(s) and {microbatches} micro-batch(es)"
        )
    return sum(stage_seconds) + (microbatches - 1) * max(stage_seconds)


def estimate(
    recordings: list, chip: str, lnc: int, fp32_precision: str = "highest", instance: str | None = None
) -> dict:
    """Estimate of the recorded ranks' run on `chip` at `lnc` (on `instance`, for its NeuronLink).

    The step time is the slowest rank's (data-parallel ranks wait for each other);
    with detected steps, the median step after the first (which also builds the model), or
    the only one.
    Without a figure the model needs, the entry holds `missing` (why) and no times.
    """
    try:
        fig = core_figures(chip, lnc, instance)
    except hw.MissingFigure as e:
        return {"chip": chip, "lnc": lnc, "instance": instance, "missing": str(e)}
    per_rank = [_rank_estimate(r, fig, fp32_precision) for r in recordings]
    slowest = max(per_rank, key=lambda e: e["step_seconds"])
    out = {"chip": chip, "lnc": lnc, "instance": instance, "missing": None, "figures": fig, **slowest}
    out.update(_utilisation(per_rank, slowest["step_seconds"], fig, fp32_precision))
    out["phases"] = phases(recordings, fig, fp32_precision)
    return out


_PHASES = ("prefill", "decode")


def phases(recordings: list, fig: dict, prec: str = "highest") -> dict | None:
    """Estimates of a generation's phases: the median prefill (time to first token) and the median
    decode step (time per output token), each of the slowest rank, with its terms, shares and MFU.
    None when the run has no decode step (training, or forwards without a KV cache); a dict with
    only `missing` when forwards ran inside torch.compile, where module hooks do not delimit them."""
    recorded = [r.generation for r in recordings]
    if not any(b.phase == "decode" for g in recorded for b in g.forwards):
        return None
    if any(g.compiled_outside for g in recorded):
        return {
            "missing": "a compiled graph ran outside any forward the report could delimit (a callable compiled "
            "before the report started); its phases are estimated for eager forwards and for callables "
            "compiled during the report"
        }
    out = {}
    for phase in _PHASES:
        per_rank = []
        for rec, g in zip(recordings, recorded):
            buckets = [b for b in g.forwards if b.phase == phase]
            if buckets:
                per_rank.append(_phase_rank(rec, buckets, fig, prec))
        if not per_rank:
            out[phase] = None
            continue
        slowest = max(per_rank, key=lambda e: e["seconds"])
        util = _utilisation(per_rank, slowest["seconds"], fig, prec)
        out[phase] = {**slowest, "mfu": util["mfu"], "mfu_dtype": util["mfu_dtype"], "model_flops": util["model_flops"]}
    return out


def _phase_rank(rec, buckets: list, fig: dict, prec: str) -> dict:
    """One rank's median bucket of a phase: its seconds, terms and shares."""
    times = _bucket_times(buckets, rec.graph_parts, fig, prec)
    median, i = _median_bucket([t.seconds for t in times])
    return {
        "seconds": median,
        "count": len(buckets),
        "tokens": buckets[i].tokens,
        **_summary([buckets[i]], times[i].hidden, rec.graph_parts, fig, prec, top=20),
    }


def _utilisation(per_rank: list, seconds: float, fig: dict, prec: str) -> dict:
    """MFU: every rank's matmul-like FLOPs in the step over what all ranks' cores could do in
    `seconds` at the dense peak of the dtype that has most of those FLOPs."""
    flops: dict = {}
    for r in per_rank:
        for dtype, f in r["tensor_flops"].items():
            flops[dtype] = flops.get(dtype, 0) + f
    total = sum(flops.values())
    if not total or not seconds:
        return {"model_flops": total, "mfu_dtype": None, "peak_flops": None, "mfu": None}
    dtype = max(flops, key=flops.get)
    peak = _tensor_rate(fig, dtype, prec) * len(per_rank)
    return {"model_flops": total, "mfu_dtype": dtype, "peak_flops": peak, "mfu": total / (seconds * peak)}


def _graph_seconds(parts: dict, fig: dict, prec: str) -> dict:
    """Estimated seconds of one run of each compiled graph, from its parts."""
    return {g: sum(call_time(fig, p, prec)[0] for p in ps) for g, ps in parts.items()}


class _BucketTime(NamedTuple):
    """What the step times and a breakdown's hidden collective time read of one Bucket."""

    seconds: float  # estimated
    hidden: float  # of asynchronous collectives, under compute


def _bucket_time(b, fig: dict, prec: str, graph_seconds: dict) -> _BucketTime:
    """Estimated seconds, and seconds of asynchronous collectives hidden under compute, of a Bucket,
    by the overlap rule of ASSUMPTIONS (collectives waited for add their whole time; asynchronous
    ones only what exceeds the bucket's compute)."""
    compute = sum(call_time(fig, c, prec)[0] * n for c, n in b.ops.items())
    compute += sum(graph_seconds[g] * n for g, n in b.graphs.items())
    waited = overlappable = 0.0
    for c, n in b.collectives.items():
        t = collective_time(fig, c.kind, c.bytes, c.group_size)[0] * n
        if c.asynchronous:
            overlappable += t
        else:
            waited += t
    hidden = min(overlappable, compute)
    return _BucketTime(compute + waited + overlappable - hidden, hidden)


def _bucket_times(buckets: list, parts: dict, fig: dict, prec: str) -> list:
    """The _BucketTime of each Bucket (each compiled graph in `parts` timed once)."""
    graph_seconds = _graph_seconds(parts, fig, prec)
    return [_bucket_time(b, fig, prec, graph_seconds) for b in buckets]


def _median_bucket(seconds: list) -> tuple:
    """(median seconds, index of the bucket nearest to it): the bucket the breakdown shows."""
    median = statistics.median(seconds)
    return median, min(range(len(seconds)), key=lambda j: abs(seconds[j] - median))


def _summary(scope: list, hidden: float, parts: dict, fig: dict, prec: str, top: int | None = None) -> dict:
    """Terms, their shares, the dominant one, Tensor Engine FLOPs and the costliest ops of `scope`;
    `hidden` is the time of its asynchronous collectives under compute, from its _BucketTimes."""
    terms, by_op, tensor_flops = _breakdown(scope, parts, fig, prec)
    total = sum(terms.values()) or 1.0
    return {
        "terms": terms,
        # of the collective terms: asynchronous collectives' time that runs under compute
        "hidden_seconds": hidden,
        "term_shares": {k: v / total for k, v in terms.items()},
        "dominant": max(terms, key=terms.get),
        "tensor_flops": tensor_flops,
        "ops": sorted(by_op.values(), key=lambda e: -e["seconds"])[:top],
    }


def _rank_estimate(rec, fig: dict, prec: str) -> dict:
    n_steps = rec.steps
    buckets = rec.buckets
    times = _bucket_times(buckets, rec.graph_parts, fig, prec)
    seconds = [t.seconds for t in times]
    if n_steps:
        # the first step also builds the model and the optimizer's state: of several, left out
        first = 1 if n_steps > 1 else 0
        step_seconds, i = _median_bucket(seconds[first:n_steps])
        i += first
        scope, times = [buckets[i]], [times[i]]  # the breakdown is of the median step
    else:
        step_seconds = sum(seconds)
        scope = buckets
    summary = _summary(scope, sum(t.hidden for t in times), rec.graph_parts, fig, prec)
    terms = summary["terms"]
    total = sum(terms.values()) or 1.0
    shares = {
        "compute": terms["compute"] / total,
        "memory": terms["memory"] / total,
        "fixed": terms["fixed"] / total,
        "collectives": (terms["collective latency"] + terms["collective bandwidth"]) / total,
    }
    return {
        "rank": rec.rank,
        "step_seconds": step_seconds,
        "bucket_seconds": seconds,
        "per_step": bool(n_steps),
        **summary,
        "shares": shares,
    }


def _add_call(terms: dict, e: dict, t: float, p: dict, flops: int, nbytes: int, n: int) -> bool:
    """Count `n` calls of one op (time `t`, parts `p`) in the terms and its breakdown row `e`;
    True when compute-bound."""
    terms["fixed"] += p["fixed"] * n
    compute_bound = p["compute"] >= p["memory"]
    terms["compute" if compute_bound else "memory"] += max(p["compute"], p["memory"]) * n
    e["flops"] += flops * n
    e["bytes"] += nbytes * n
    e["seconds"] += t * n
    e["fixed_seconds"] += p["fixed"] * n
    return compute_bound


def _breakdown(scope: list, parts: dict, fig: dict, prec: str) -> tuple:
    """(terms, per-op rows, matmul-like FLOPs by dtype) of the buckets in `scope`."""
    terms = {"fixed": 0.0, "compute": 0.0, "memory": 0.0, "collective latency": 0.0, "collective bandwidth": 0.0}
    by_op: dict = {}
    tensor_flops: dict = {}
    for b in scope:
        for g, n in b.graphs.items():
            ps = parts[g]
            e = by_op.setdefault((g, _graph_dtype(ps)), _breakdown_entry(g, _graph_dtype(ps)))
            e["count"] += n
            compute = memory = 0.0
            for part in ps:
                t, p = call_time(fig, part, prec)
                # Tensor Engine FLOPs only, as for ops: a fused kernel's count is of vector operations
                _add_call(terms, e, t, p, part.flops if part.kind == "tensor" else 0, part.bytes, n)
                compute, memory = compute + p["compute"], memory + p["memory"]
                if part.kind == "tensor":
                    tensor_flops[part.dtype] = tensor_flops.get(part.dtype, 0) + part.flops * n
            e["compute_bound_calls"] += n if compute >= memory else 0
        for c, n in b.ops.items():
            if c.kind == "view":
                continue
            t, p = call_time(fig, c, prec)
            e = by_op.setdefault((c.op, c.dtype), _breakdown_entry(c.op, c.dtype))
            e["count"] += n
            e["compute_bound_calls"] += n if _add_call(terms, e, t, p, c.flops, c.bytes, n) else 0
            if c.kind == "tensor":
                tensor_flops[c.dtype] = tensor_flops.get(c.dtype, 0) + c.flops * n
        for c, n in b.collectives.items():
            t, lat, bw = collective_time(fig, c.kind, c.bytes, c.group_size)
            terms["collective latency"] += lat * n
            terms["collective bandwidth"] += bw * n
            name = f"c10d::{c.kind}"
            e = by_op.setdefault((name, c.dtype), _breakdown_entry(name, c.dtype))
            e["count"] += n
            e["bytes"] += c.bytes * n
            e["seconds"] += t * n
    return terms, by_op, tensor_flops


class TimeModel:
    """The time model for one chip at one LNC (on `instance`, for its NeuronLink and EFA), for
    scripts that compose their own estimate (a benchmark's): one method per term."""

    def __init__(self, chip: str, lnc: int, instance: str | None = None, fp32_precision: str = "highest"):
        self.figures = core_figures(chip, lnc, instance)
        self.instance = instance
        self.fp32_precision = fp32_precision

    def op_seconds(self, call) -> float:
        """One call of an :class:`OpCall` or a :class:`GraphPart`."""
        return call_time(self.figures, call, self.fp32_precision)[0]

    def collective_seconds(self, kind: str, nbytes: int, group_size: int, across_instances: bool = False) -> float:
        return collective_time(self.figures, kind, nbytes, group_size, across_instances)[0]

    @staticmethod
    def pipeline_seconds(stage_seconds: list, microbatches: int) -> float:
        return pipeline_seconds(stage_seconds, microbatches)

    def bucket(self, recording, bucket) -> dict:
        """Estimated ``seconds``, ``terms`` and matmul-like ``tensor_flops`` (by dtype) of one bucket
        of `recording` (a step, or a region: ``recording.region(name)``)."""
        parts, fig, prec = recording.graph_parts, self.figures, self.fp32_precision
        terms, _, flops = _breakdown([bucket], parts, fig, prec)
        seconds, hidden = _bucket_time(bucket, fig, prec, _graph_seconds(parts, fig, prec))
        return {"seconds": seconds, "hidden_seconds": hidden, "terms": terms, "tensor_flops": flops}

    def estimate(self, recordings: list) -> dict:
        """The estimate a report shows for these ranks' recordings (step time, terms, MFU, phases)."""
        f = self.figures
        return estimate(recordings, f["chip"], f["lnc"], self.fp32_precision, self.instance)
