"""From op times to a step's: buckets by the overlap rule, a rank's median step, the slowest rank,
MFU, and a generation's phases; each as a typed result (``results``)."""

from __future__ import annotations

import statistics
from typing import NamedTuple

from neuronsim import collectives as _vocabulary
from neuronsim import hardware as hw

from . import pipeline as _pipeline
from .collective_time import collective_time
from .results import (
    SHARES,
    Breakdown,
    BucketEstimate,
    Estimate,
    OpRow,
    PhaseEstimate,
    Phases,
    RankEstimate,
    Utilisation,
    no_terms,
)
from .time_model import call_time, core_figures, tensor_rate


def estimate(
    recordings: list, chip: str, lnc: int, fp32_precision: str = "highest", instance: str | None = None
) -> Estimate:
    """Estimate of the recorded ranks' run on `chip` at `lnc` (on `instance`, for its NeuronLink).

    The step time is the slowest rank's (data-parallel ranks wait for each other); with detected
    steps, the median step after the first (which also builds the model), or the only one.
    Without a figure the model needs, the estimate holds `missing` (why) and no times.
    """
    try:
        fig = core_figures(chip, lnc, instance)
        stages = _stage_times(recordings, fig, fp32_precision)
        per_rank = [_rank_estimate(r, fig, fp32_precision, stages) for r in recordings]
    except hw.MissingFigure as e:
        return Estimate(chip=chip, lnc=lnc, instance=instance, missing=str(e))
    slowest = max(per_rank, key=lambda e: e.step_seconds)
    util = _utilisation(per_rank, slowest.step_seconds, fig, fp32_precision)
    return Estimate(
        **vars(slowest),
        **vars(util),
        chip=chip,
        lnc=lnc,
        instance=instance,
        figures=fig,
        phases=phases(recordings, fig, fp32_precision),
    )


def phases(recordings: list, fig: dict, prec: str = "highest") -> Phases | None:
    """Estimates of a generation's phases: the median prefill (time to first token) and the median
    decode step (time per output token), each of the slowest rank, with its terms, shares and MFU.
    None when the run has no decode step (training, or forwards without a KV cache); `missing`
    when a compiled graph ran outside the forwards the recording delimited."""
    recorded = [r.generation for r in recordings]
    if not any(b.phase == "decode" for g in recorded for b in g.forwards):
        return None
    if any(g.compiled_outside for g in recorded):
        return Phases(
            missing="a compiled graph ran outside any forward the report could delimit (a callable compiled "
            "before the report started, called in a loop of the script's own); its phases are estimated for "
            "transformers' generate, for eager forwards and for callables compiled during the report"
        )
    out = Phases()
    for phase in ("prefill", "decode"):
        per_rank = [
            _phase_rank(rec, buckets, fig, prec)
            for rec, g in zip(recordings, recorded)
            if (buckets := [b for b in g.forwards if b.phase == phase])
        ]
        if per_rank:
            slowest = max(per_rank, key=lambda e: e.seconds)
            util = _utilisation(per_rank, slowest.seconds, fig, prec)
            slowest.mfu, slowest.mfu_dtype, slowest.model_flops = util.mfu, util.mfu_dtype, util.model_flops
            setattr(out, phase, slowest)
    return out


def _phase_rank(rec, buckets: list, fig: dict, prec: str) -> PhaseEstimate:
    """One rank's median bucket of a phase: its seconds, terms and shares."""
    times = _bucket_times(buckets, rec.graph_parts, fig, prec)
    median, i = _median_bucket([t.seconds for t in times])
    summary = _summary([buckets[i]], times[i].hidden, rec.graph_parts, fig, prec, top=20)
    return PhaseEstimate(**vars(summary), seconds=median, count=len(buckets), tokens=buckets[i].tokens)


def _utilisation(per_rank: list, seconds: float, fig: dict, prec: str) -> Utilisation:
    """MFU: every rank's matmul-like FLOPs in the step over what all ranks' cores could do in
    `seconds` at the dense peak of the dtype that has most of those FLOPs."""
    flops: dict = {}
    for r in per_rank:
        for dtype, f in r.tensor_flops.items():
            flops[dtype] = flops.get(dtype, 0) + f
    total = sum(flops.values())
    if not total or not seconds:
        return Utilisation(model_flops=total)
    dtype = max(flops, key=flops.get)
    peak = tensor_rate(fig, dtype, prec) * len(per_rank)
    return Utilisation(model_flops=total, mfu_dtype=dtype, peak_flops=peak, mfu=total / (seconds * peak))


def _graph_seconds(parts: dict, fig: dict, prec: str) -> dict:
    """Estimated seconds of one run of each compiled graph, from its parts."""
    return {g: sum(call_time(fig, p, prec)[0] for p in ps) for g, ps in parts.items()}


class _BucketTime(NamedTuple):
    """What the step times and a breakdown's hidden collective time read of one Bucket."""

    seconds: float  # estimated
    hidden: float  # of asynchronous collectives, under compute


def _bucket_time(b, fig: dict, prec: str, graph_seconds: dict) -> _BucketTime:
    """Estimated seconds, and seconds of asynchronous collectives hidden under compute, of a Bucket,
    by the overlap rule of the assumptions (collectives waited for add their whole time;
    asynchronous ones only what exceeds the bucket's compute)."""
    compute = sum(call_time(fig, c, prec)[0] * n for c, n in b.ops.items())
    compute += sum(graph_seconds[g] * n for g, n in b.graphs.items())
    waited = overlappable = 0.0
    for c, n in b.collectives.items():
        t = collective_time(fig, c.kind, c.bytes, c.group_size, c.instances)[0] * n
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


def bucket_estimate(parts: dict, bucket, fig: dict, prec: str) -> BucketEstimate:
    """One bucket's estimate, for a benchmark that composes its own (``TimeModel.bucket``)."""
    terms, _, flops = _breakdown([bucket], parts, fig, prec)
    seconds, hidden = _bucket_time(bucket, fig, prec, _graph_seconds(parts, fig, prec))
    return BucketEstimate(seconds, hidden, terms, flops)


def _median_bucket(seconds: list) -> tuple:
    """(median seconds, index of the bucket nearest to it): the bucket the breakdown shows."""
    median = statistics.median(seconds)
    return median, min(range(len(seconds)), key=lambda j: abs(seconds[j] - median))


def _summary(scope: list, hidden: float, parts: dict, fig: dict, prec: str, top: int | None = None) -> Breakdown:
    """Terms, their shares, the dominant one, Tensor Engine FLOPs and the costliest ops of `scope`;
    `hidden` is the time of its asynchronous collectives under compute, from its _BucketTimes."""
    terms, by_op, tensor_flops = _breakdown(scope, parts, fig, prec)
    return Breakdown(
        terms=terms,
        hidden_seconds=hidden,
        **_shares(terms),
        tensor_flops=tensor_flops,
        ops=sorted(by_op.values(), key=lambda e: -e.seconds)[:top],
    )


def _shares(terms: dict) -> dict:
    """A Breakdown's term_shares and dominant term, of its `terms`."""
    total = sum(terms.values()) or 1.0
    return {"term_shares": {k: v / total for k, v in terms.items()}, "dominant": max(terms, key=terms.get)}


def _stage_times(recordings: list, fig: dict, prec: str) -> dict:
    """{stage: StageTimes} of every pipeline stage the recordings ran (each stage's first recording);
    a stage of a schedule that no recording ran takes the slowest recorded stage's times."""
    times: dict = {}  # stage -> kind -> [seconds per micro-batch run]
    stages = 0
    for r in recordings:
        p = r.pipeline
        if p is None:
            continue
        stages = max(stages, p.stages)
        graph_seconds = _graph_seconds(r.graph_parts, fig, prec)
        mine: dict = {}
        for key, b in p.actions.items():
            stage, kind, mb = key.split(":")
            mine.setdefault(int(stage), {}).setdefault(kind, {})[int(mb)] = _bucket_time(b, fig, prec, graph_seconds)[0]
        for stage, kinds in mine.items():
            times.setdefault(stage, {k: [v[mb] for mb in sorted(v)] for k, v in kinds.items()})
    out = {s: _pipeline.StageTimes(t) for s, t in times.items()}
    slowest = max(out.values(), key=lambda t: sum(map(sum, t.seconds.values())), default=None)
    return {s: out.get(s, slowest) for s in range(stages)} if slowest is not None else {}


def _pipeline_step(rec, step, step_seconds: float, fig: dict, prec: str, stages: dict) -> tuple:
    """(seconds, bubble) of a pipeline rank's step: the schedule's critical path over every rank
    of the pipeline (``pipeline``), plus this rank's own work in its step (the Bucket `step`)
    outside the schedule's actions and their point-to-point transfers (the path has those)."""
    p = rec.pipeline
    graph_seconds = _graph_seconds(rec.graph_parts, fig, prec)
    actions = sum(_bucket_time(b, fig, prec, graph_seconds).seconds for b in p.actions.values())  # one step's
    p2p = [(c, n) for c, n in step.collectives.items() if _is_point_to_point(c.kind)]
    times = [(collective_time(fig, c.kind, c.bytes, c.group_size, c.instances)[0], n) for c, n in p2p]
    path = _pipeline.critical_path(p.order, stages, max((t for t, _ in times), default=0.0))
    outside = max(step_seconds - actions - sum(t * n for t, n in times), 0.0)
    return outside + path, path - _pipeline.busiest_rank(p.order, stages)


def _pipeline_totals(rec, step, fig: dict, prec: str) -> tuple:
    """(terms, matmul-like FLOPs by dtype) of a pipeline rank's step of all the script's micro-batches:
    its step's outside the schedule's actions, and each of its actions in the schedule's order, one
    not run (a shortened step's) taking a run one's terms and FLOPs as it takes its time (StageTimes)."""
    p = rec.pipeline
    terms, _, flops = _breakdown([step], rec.graph_parts, fig, prec)
    totals = (terms, flops)
    run: dict = {}  # (0: terms or 1: FLOPs, its key, stage, kind) -> {micro-batch run: its amount}
    for key, b in p.actions.items():
        stage, kind, mb = key.split(":")
        b_terms, _, b_flops = _breakdown([b], rec.graph_parts, fig, prec)
        for which, amounts in enumerate((b_terms, b_flops)):
            for k, v in amounts.items():
                totals[which][k] = totals[which].get(k, 0) - v
                run.setdefault((which, k, int(stage), kind), {})[int(mb)] = v
    n = _pipeline.microbatches(p.order)
    in_order: dict = {}  # (stage, kind) -> the micro-batches of its actions in the schedule
    for acts in p.order.values():
        for s, k, mb in acts:
            in_order.setdefault((s, k), []).append(mb)
    for (which, k, stage, kind), by_mb in run.items():
        per = _pipeline.StageTimes({kind: [by_mb[m] for m in sorted(by_mb)]})
        totals[which][k] += sum(per.time(kind, mb, n) for mb in in_order.get((stage, kind), []))
    return totals


def _is_point_to_point(kind: str) -> bool:
    found = _vocabulary.find(kind)
    return found is not None and found.point_to_point


def _rank_estimate(rec, fig: dict, prec: str, stages: dict | None = None) -> RankEstimate:
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
    bubble = 0.0
    if rec.pipeline is not None and stages:
        step_seconds, bubble = _pipeline_step(rec, scope[-1], step_seconds, fig, prec, stages)
    summary = _summary(scope, sum(t.hidden for t in times), rec.graph_parts, fig, prec)
    if rec.pipeline is not None and stages:
        # the step's terms and FLOPs are of all its micro-batches, as its time is, not of those run
        summary.terms, summary.tensor_flops = _pipeline_totals(rec, scope[-1], fig, prec)
        vars(summary).update(_shares(summary.terms))
    terms = summary.terms
    total = sum(terms.values()) or 1.0
    collectives = terms["collective latency"] + terms["collective bandwidth"]
    shares = {k: (collectives if k == "collectives" else terms[k]) / total for k in SHARES}
    return RankEstimate(
        **vars(summary), rank=rec.rank, step_seconds=step_seconds, bucket_seconds=seconds, per_step=bool(n_steps),
        shares=shares, bubble_seconds=bubble,
    )  # fmt: skip


def _add_call(terms: dict, e: OpRow, t: float, p: dict, flops: int, nbytes: int, n: int) -> bool:
    """Count `n` calls of one op (time `t`, parts `p`) in the terms and its breakdown row `e`;
    True when compute-bound."""
    terms["fixed"] += p["fixed"] * n
    compute_bound = p["compute"] >= p["memory"]
    terms["compute" if compute_bound else "memory"] += max(p["compute"], p["memory"]) * n
    e.flops += flops * n
    e.bytes += nbytes * n
    e.seconds += t * n
    e.fixed_seconds += p["fixed"] * n
    return compute_bound


def _graph_dtype(parts: list) -> str:
    """A compiled graph's row is labelled with the dtype of its matmuls (else of its fused kernel)."""
    return next((p.dtype for p in parts if p.kind == "tensor"), parts[0].dtype if parts else "-")


def _graph_rows(b, parts: dict, fig: dict, prec: str, terms: dict, by_op: dict, tensor_flops: dict) -> None:
    for g, n in b.graphs.items():
        ps = parts[g]
        e = by_op.setdefault((g, _graph_dtype(ps)), OpRow(g, _graph_dtype(ps)))
        e.count += n
        compute = memory = 0.0
        for part in ps:
            t, p = call_time(fig, part, prec)
            # Tensor Engine FLOPs only, as for ops: a fused kernel's count is of vector operations
            _add_call(terms, e, t, p, part.flops if part.kind == "tensor" else 0, part.bytes, n)
            compute, memory = compute + p["compute"], memory + p["memory"]
            if part.kind == "tensor":
                tensor_flops[part.dtype] = tensor_flops.get(part.dtype, 0) + part.flops * n
        e.compute_bound_calls += n if compute >= memory else 0


def _breakdown(scope: list, parts: dict, fig: dict, prec: str) -> tuple:
    """(terms, per-op rows, matmul-like FLOPs by dtype) of the buckets in `scope`."""
    terms = no_terms()
    by_op: dict = {}
    tensor_flops: dict = {}
    for b in scope:
        _graph_rows(b, parts, fig, prec, terms, by_op, tensor_flops)
        for c, n in b.ops.items():
            if c.kind == "view":
                continue
            t, p = call_time(fig, c, prec)
            e = by_op.setdefault((c.op, c.dtype), OpRow(c.op, c.dtype))
            e.count += n
            e.compute_bound_calls += n if _add_call(terms, e, t, p, c.flops, c.bytes, n) else 0
            if c.kind == "tensor":
                tensor_flops[c.dtype] = tensor_flops.get(c.dtype, 0) + c.flops * n
        for c, n in b.collectives.items():
            t, lat, bw = collective_time(fig, c.kind, c.bytes, c.group_size, c.instances)
            terms["collective latency"] += lat * n
            terms["collective bandwidth"] += bw * n
            name = f"c10d::{c.kind}"
            e = by_op.setdefault((name, c.dtype), OpRow(name, c.dtype))
            e.count += n
            e.bytes += c.bytes * n
            e.seconds += t * n
    return terms, by_op, tensor_flops
