"""Merging the ranks' recordings into the report's data: ranks run, fallbacks, compile story,
memory per core (identical ranks share an entry), dry-run reads, collectives per step."""

from __future__ import annotations

import collections
import dataclasses

from . import desync
from .text import ranges
from .verdict import is_oom


def ranks_run(raws, classes: dict | None = None) -> dict:
    """The job's world size, the ranks run, and the ranks not answered: with neither a recording
    here nor a proven class (see ``answered_by``)."""
    world = max(int(r.world_size or 1) for r in raws)
    ran = {int(r.rank) for r in raws}
    answered = ran | set(answered_by(classes))
    return {"world_size": world, "ranks_run": sorted(ran), "ranks_not_run": sorted(set(range(world)) - answered)}


def answered_by(classes: dict | None) -> dict:
    """{rank: the rank whose run answers for it} of the ranks a dry run by classes did not run:
    every member of a proven class, answered by the class's representative."""
    out = {}
    for c in (classes or {}).get("classes", []):
        if c["proven"]:
            out.update({r: c["rep"] for r in c["ranks"] if r != c["rep"]})
    return out


def fallbacks(raws) -> list:
    merged: dict = {}
    for r in raws:
        for f in r.fallbacks:
            e = merged.setdefault(
                (f.op, f.dtype, f.reason),
                {"op": f.op, "dtype": f.dtype, "reason": f.reason, "count": 0, "sites": collections.Counter()},
            )
            e["count"] += f.count
            e["sites"].update(f.sites)
    out = sorted(merged.values(), key=lambda e: -e["count"])
    for e in out:
        e["sites"] = dict(e["sites"].most_common())
    return out


def compile_story(raws) -> dict:
    c0 = raws[0].compile  # ranks run the same program: rank 0's compile story stands for all
    breaks = collections.Counter()
    for b in c0.graph_breaks:
        breaks[(b["reason"], b["site"])] += b["count"]
    per_step = c0.step_recompilations
    dynamic = sorted({r["graph"].rsplit("_s", 1)[0] for r in c0.recompilations if "dynamic" in r["reason"]})
    counted = sum(c0.graph_break_counts.values())
    return {
        "graphs": c0.graphs,
        "recompilations": c0.recompilations,
        "fallbacks": c0.fallbacks,
        "graph_breaks": [{"reason": r, "site": s, "count": n} for (r, s), n in breaks.most_common()],
        "graph_break_total": max(counted, sum(breaks.values())),
        "graph_break_counts": c0.graph_break_counts,
        "dynamic_shapes": dynamic,
        "step_recompilations": per_step,
        "recompiles_every_step": len(per_step) >= 3 and all(n > 0 for n in per_step[1:]),
    }


def _core_entry(m) -> dict:
    """A core's memory as the report's data holds it."""
    top = [{k: v for k, v in dataclasses.asdict(t).items() if k != "kind" or v is not None} for t in m.snapshot.top]
    e = {
        "peak_allocated": m.peak_allocated,
        "peak_reserved": m.peak_reserved,
        "capacity": m.capacity,
        "num_ooms": m.num_ooms,
        "series": m.series,
        "top_tensors_at": m.snapshot.at,
        "top_tensors": top,
    }
    if m.snapshot.breakdown is not None:
        e["breakdown"] = m.snapshot.breakdown
    return e


def memory(raws, cap, rank_classes: dict | None = None) -> list:
    """One entry per core; ranks whose memory is identical in every figure the report shows
    (peaks, breakdown, largest tensors) share one entry, which lists them; a rank not run that a
    proven class answers for shares its representative's."""
    out, classes = [], {}
    for r in raws:
        for core, cm in r.memory.items():
            m = _core_entry(cm)
            oom = m["num_ooms"] > 0 or is_oom(r.error)
            key = (
                m["peak_allocated"],
                m["peak_reserved"],
                oom,
                tuple(sorted((m.get("breakdown") or {}).items())),
                tuple((t["bytes"], tuple(t["shape"]), t["dtype"], t["op"]) for t in m["top_tensors"]),
            )
            if len(raws) > 1 and key in classes:
                classes[key]["ranks"].append(r.rank)
                continue
            # What tensors hold must fit; the allocator's cache above that shrinks under pressure.
            e = dict(m, core=str(core), ranks=[r.rank], oom=oom, fits=not oom and m["peak_allocated"] <= cap)
            classes[key] = e
            out.append(e)
    ran = {int(r.rank) for r in raws}
    for rank, rep in answered_by(rank_classes).items():
        for e in out:
            if rep in e["ranks"] and rank not in ran and rank not in e["ranks"]:
                e["ranks"].append(rank)
    for e in out:
        e["ranks"].sort()
    for e in out:
        if len(raws) == 1:
            e["label"] = f"neuron:{e['core']}"
        elif len(e["ranks"]) == 1:
            e["label"] = f"rank {e['ranks'][0]} neuron:{e['core']}"
        else:
            e["label"] = f"ranks {ranges(e['ranks'])}"
    return out


def memory_per_rank(raws, classes: dict | None = None) -> list:
    """Every rank's peaks, run or answered by its class (the report's tables group identical ranks)."""
    by_rank = {int(r.rank): r for r in raws}
    ranks = sorted(set(by_rank) | set(answered_by(classes)))
    whose = {**answered_by(classes), **{r: r for r in by_rank}}
    per_node = (classes or {}).get("nproc_per_node")
    return [
        {
            "rank": rank,
            "core": int(core) if rank in by_rank or not per_node else rank % per_node,
            "peak_allocated": m.peak_allocated,
            "peak_reserved": m.peak_reserved,
        }
        for rank in ranks
        for core, m in by_rank[whose[rank]].memory.items()
    ]


def dry_run(raws) -> dict | None:
    dry = [r for r in raws if r.dry_run]
    if not dry:
        return None
    # Ranks run one program; rank 0's reads stand for all, as its compile story does.
    reads = dry[0].value_reads
    return {
        "value_reads": [
            {"site": v.site, "kind": v.kind, "placeholder": v.value, "count": v.count} for v in reads if not v.assumed
        ],
        "assumed": [{"site": v.site, "check": v.kind, "value": v.value, "count": v.count} for v in reads if v.assumed],
        # every rank's own files (a rank that saves nothing lists none), each save once: by path and
        # line, as file objects have no path (two BytesIO saved at two lines are two entries)
        "saved_without_data": list({(f["path"], f["site"]): f for r in dry for f in r.saved_without_data}.values()),
        # the weights the launcher stood in for, as every rank's recording holds them
        "absent_weights": list({a["path"]: a for r in dry for a in r.absent_weights}.values()),
    }


def collectives(raws) -> list:
    r = raws[0]
    # The steady state: steps after the first (which also holds setup, e.g. DDP's broadcasts).
    buckets = r.buckets[1 : r.steps] if r.steps >= 2 else r.buckets[: max(r.steps, 1)]
    if not r.steps:
        buckets = r.buckets
    n = max(len(buckets), 1) if r.steps else 1
    total = collections.Counter()
    for b in buckets:
        total.update(b.collectives)
    return [
        {
            "kind": c.kind,
            "dtype": c.dtype,
            "bytes": c.bytes,
            "group_size": c.group_size,
            "calls_per_step": k / n,
            "asynchronous": c.asynchronous,
        }
        for c, k in sorted(total.items(), key=lambda kv: -kv[0].bytes * kv[1])
    ]


def findings(raws) -> list:
    """What comparing the ranks' collectives (and compiled graphs) found: :class:`desync.Finding` s."""
    return desync.find(raws)


def across_ranks(raws, found: list) -> dict:
    """The comparison as the report's data holds it: the ranks, their groups and `found`."""
    return {
        "ranks_compared": [r.rank for r in raws],
        "groups": sorted({name for r in raws for name in r.groups}),
        "findings": [f.as_data() for f in found],
    }
