"""Estimated time of a recorded run on real Trainium.

Each op is timed from its FLOPs and bytes (from its shapes and dtypes) by a
roofline on one logical NeuronCore's published figures (torch_neuronx/_hardware.py,
the table the NKI cost model reads), plus the fixed costs a roofline leaves out;
each collective by a ring latency/bandwidth model of NeuronLink. ASSUMPTIONS is
printed in every report.
"""

from __future__ import annotations

import statistics

from .. import _hardware as hw

ASSUMPTIONS = (
    "Each op runs alone on one logical NeuronCore: time = fixed + max(compute, memory).",
    "compute: matmul-like ops (those torch.utils.flop_counter has a formula for) at the Tensor "
    "Engine's dense peak for their input dtype (float32 at the FP32 rate, or TF32 when "
    "torch.set_float32_matmul_precision allows it); other ops at the Vector Engine rate, one "
    "operation per element read or written.",
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
    "Engine's ramp from 50% to full speed over ~3 us before each matmul.",
    "Views cost nothing. Ops that would fall back to CPU are timed as if native; their host "
    "round trip is not modelled.",
    "collectives: ring algorithm, 10 us per ring step (calibrated on AWS's published nccom-test "
    "latencies), each rank's ring bandwidth the chip's NeuronLink bandwidth shared by its "
    "logical cores.",
    "Ops on host (CPU) tensors are not timed. Engines do not overlap one op with the next.",
)

_RAMP_AVG = (1 + hw.TENSOR_ENGINE_RAMP_START) / 2


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


def core_figures(chip: str, lnc: int) -> dict:
    """The per-logical-core figures the model uses (and prints)."""
    spec = hw.CHIPS[chip]
    if lnc not in spec.lnc_allowed:
        raise ValueError(f"{chip} supports LNC={spec.lnc_allowed}, not LNC={lnc}")
    core = spec.per_core(lnc)
    missing = [k for k in ("vector_flops", "dma_bytes_per_s") if core[k] is None]
    if missing or spec.dma_fixed_s is None or spec.neuronlink_bytes_per_s is None:
        raise ValueError(
            f"AWS publishes no {', '.join(missing) or 'DMA/NeuronLink'} figure for {chip}: " "no estimate for it"
        )
    return {
        "chip": chip,
        "lnc": lnc,
        "tensor_flops": dict(core["tensor_flops"]),
        "vector_flops": core["vector_flops"],
        "memory_bytes_per_s": min(core["hbm_bytes_per_s"], core["dma_bytes_per_s"]),
        "dma_fixed_s": spec.dma_fixed_s,
        "link_bytes_per_s": spec.neuronlink_bytes_per_s / (spec.physical_cores // lnc),
        "collective_step_latency_s": hw.COLLECTIVE_STEP_LATENCY_S,
    }


def _tensor_rate(fig: dict, dtype: str, fp32_precision: str) -> float:
    rates = fig["tensor_flops"]
    if dtype in ("bfloat16", "float16"):
        return rates[dtype]
    if dtype.startswith("float8"):
        return rates["float8"]
    if dtype == "float32" and fp32_precision != "highest":
        return rates["tf32"]
    return rates["float32"]


def op_time(
    fig: dict, kind: str, dtype: str, flops: int, nbytes: int, operands: int, fp32_precision: str = "highest"
) -> tuple:
    """(seconds, {"fixed", "compute", "memory"}) of one call."""
    if kind == "view":
        return 0.0, {"fixed": 0.0, "compute": 0.0, "memory": 0.0}
    memory = nbytes / fig["memory_bytes_per_s"]
    fixed = operands * fig["dma_fixed_s"]
    if kind == "tensor":
        compute = flops / _tensor_rate(fig, dtype, fp32_precision)
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
    return next((p[1] for p in parts if p[0] == "tensor"), parts[0][1] if parts else "-")


_RING = {  # collective -> (ring steps, bytes sent per rank), for n ranks and B bytes
    "allreduce": lambda n, b: (2 * (n - 1), 2 * (n - 1) / n * b),
    "all_reduce": lambda n, b: (2 * (n - 1), 2 * (n - 1) / n * b),
    "allgather": lambda n, b: (n - 1, (n - 1) / n * b),
    "all_gather_into_tensor": lambda n, b: (n - 1, (n - 1) / n * b),
    "allgather_base": lambda n, b: (n - 1, (n - 1) / n * b),
    "allgather_into_tensor_coalesced": lambda n, b: (n - 1, (n - 1) / n * b),
    "reduce_scatter": lambda n, b: (n - 1, (n - 1) / n * b),
    "reduce_scatter_base": lambda n, b: (n - 1, (n - 1) / n * b),
    "reduce_scatter_tensor": lambda n, b: (n - 1, (n - 1) / n * b),
    "alltoall": lambda n, b: (n - 1, (n - 1) / n * b),
    "alltoall_base": lambda n, b: (n - 1, (n - 1) / n * b),
    "all_to_all_single": lambda n, b: (n - 1, (n - 1) / n * b),
}


def collective_time(fig: dict, name: str, nbytes: int, size: int) -> tuple:
    """(seconds, latency part, bandwidth part) of one collective."""
    if size <= 1:
        return 0.0, 0.0, 0.0
    steps, sent = _RING.get(name, lambda n, b: (n - 1, b))(size, nbytes)
    lat = steps * fig["collective_step_latency_s"]
    bw = sent / fig["link_bytes_per_s"]
    return lat + bw, lat, bw


def estimate(raws: list, chip: str, lnc: int, fp32_precision: str = "highest") -> dict:
    """Estimate of the recorded ranks' run on `chip` at `lnc`.

    The step time is the slowest rank's (data-parallel ranks wait for each other);
    with detected steps, the median step (the first one also builds the model).
    """
    fig = core_figures(chip, lnc)
    per_rank = [_rank_estimate(r, fig, fp32_precision) for r in raws]
    slowest = max(per_rank, key=lambda e: e["step_seconds"])
    return {"chip": chip, "lnc": lnc, "figures": fig, **slowest}


def _rank_estimate(raw: dict, fig: dict, prec: str) -> dict:
    n_steps = raw["steps"]
    parts = raw.get("graph_parts", {})
    graph_seconds = {g: sum(op_time(fig, *p, prec)[0] for p in ps) for g, ps in parts.items()}
    buckets = list(zip(raw["ops"], raw["collectives"], raw.get("graphs") or [[]] * len(raw["ops"])))
    step_buckets = buckets[:n_steps] if n_steps else buckets
    seconds = []
    for ops, colls, graphs in buckets:
        t = sum(op_time(fig, k, d, f, b, o, prec)[0] * n for _, d, k, f, b, o, n in ops)
        t += sum(collective_time(fig, name, b, s)[0] * n for name, _, b, s, n in colls)
        t += sum(graph_seconds[g] * n for g, n in graphs)
        seconds.append(t)
    if n_steps:
        step_seconds = statistics.median(seconds[:n_steps])
        # the breakdown is of the median step
        i = min(range(n_steps), key=lambda j: abs(seconds[j] - step_seconds))
        scope = [step_buckets[i]]
    else:
        step_seconds = sum(seconds)
        scope = step_buckets
    terms = {"fixed": 0.0, "compute": 0.0, "memory": 0.0, "collective latency": 0.0, "collective bandwidth": 0.0}
    by_op: dict = {}
    for ops, colls, graphs in scope:
        for g, n in graphs:
            ps = parts[g]
            e = by_op.setdefault((g, _graph_dtype(ps)), _breakdown_entry(g, _graph_dtype(ps)))
            e["count"] += n
            compute = memory = 0.0
            for k, d, f, b, o in ps:
                t, p = op_time(fig, k, d, f, b, o, prec)
                terms["fixed"] += p["fixed"] * n
                bound = "compute" if p["compute"] >= p["memory"] else "memory"
                terms[bound] += max(p["compute"], p["memory"]) * n
                compute, memory = compute + p["compute"], memory + p["memory"]
                e["flops"] += (f if k == "tensor" else 0) * n  # Tensor Engine FLOPs, as for ops
                e["bytes"] += b * n
                e["seconds"] += t * n
                e["fixed_seconds"] += p["fixed"] * n
            e["compute_bound_calls"] += n if compute >= memory else 0
        for name, d, k, f, b, o, n in ops:
            t, parts = op_time(fig, k, d, f, b, o, prec)
            if k == "view":
                continue
            terms["fixed"] += parts["fixed"] * n
            bound = "compute" if parts["compute"] >= parts["memory"] else "memory"
            terms[bound] += max(parts["compute"], parts["memory"]) * n
            e = by_op.setdefault((name, d), _breakdown_entry(name, d))
            e["count"] += n
            e["flops"] += f * n
            e["bytes"] += b * n
            e["seconds"] += t * n
            e["fixed_seconds"] += parts["fixed"] * n
            e["compute_bound_calls"] += n if bound == "compute" else 0
        for name, d, b, s, n in colls:
            t, lat, bw = collective_time(fig, name, b, s)
            terms["collective latency"] += lat * n
            terms["collective bandwidth"] += bw * n
            e = by_op.setdefault((f"c10d::{name}", d), _breakdown_entry(f"c10d::{name}", d))
            e["count"] += n
            e["bytes"] += b * n
            e["seconds"] += t * n
    total = sum(terms.values()) or 1.0
    return {
        "rank": raw["rank"],
        "step_seconds": step_seconds,
        "bucket_seconds": seconds,
        "per_step": bool(n_steps),
        "terms": terms,
        "term_shares": {k: v / total for k, v in terms.items()},
        "dominant": max(terms, key=terms.get),
        "ops": sorted(by_op.values(), key=lambda e: -e["seconds"]),
    }
