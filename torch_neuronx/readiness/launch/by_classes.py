"""A dry run of a torchrun job by rank classes (``classes``): rank 0 first, then one representative
and its witnesses per class, then the classes a difference split, until every class is proven or
the runs a dry run allows are spent. Writes the classes to ``classes.json`` next to the ranks'
recordings, with what the dry run itself cost."""

from __future__ import annotations

import json
import os
import time
import types

from ..dry import mailbox
from ..record.recording import Recording
from . import classes as _classes
from .job import Job, groups_path


def _recording(job: Job, rank: int) -> Recording | None:
    path = os.path.join(job.raw_dir, f"rank{rank}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return Recording.from_json(f.read())


def _run_round(scheduler, job: Job, ranks: list, env, started: tuple = ()) -> None:
    """Run `ranks` together (`started`: those of them already running), then wait for all to end."""
    mailbox.set_running(job.raw_dir, ranks)
    scheduler.round(ranks, started=len(started))
    for rank in ranks:
        if rank not in started:
            scheduler.start(rank, env(rank))
    scheduler.drain()


def _rank0_groups(job: Job, scheduler) -> tuple:
    """Rank 0's process groups once it has built them (at its first forward), or at its end; and its
    pipeline stage's group (its global ranks; None without one)."""
    while 0 not in scheduler.exited and 0 in scheduler.loading:
        scheduler.wait_event()
    path = groups_path(job.raw_dir, 0)
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        groups = {n: types.SimpleNamespace(name=n, **g) for n, g in found["groups"].items()}
        return groups, found["pipeline"]
    rec = _recording(job, 0)
    if rec is None:
        return {}, None
    return rec.groups, (rec.pipeline.group if rec.pipeline is not None else None)


def _odd_one(mesh, rep: int, w: int, fingerprints: dict) -> int:
    """Of a representative and a witness that differ, the one to split off: the witness when no
    other run of its pipeline stage is like it and one is like the representative (a script's
    branch on one rank, `rank == world - 1`), else the representative."""
    pipe = _classes.pipeline_dims(mesh)

    def stage(r: int) -> tuple:
        return tuple(mesh.coords(r)[i] for i in pipe)

    def like(a: dict) -> bool:
        return any(
            not _classes.differences(a, f)
            for r, f in fingerprints.items()
            if r not in (rep, w) and stage(r) == stage(w)
        )

    return w if like(fingerprints[rep]) and not like(fingerprints[w]) else rep


def _cut(c, mesh, w: int, fingerprints: dict) -> tuple:
    """Where to split `c`, whose witness `w` differs from its representative: a dimension on which
    the runs like the representative and those unlike it have no coordinate in common (uneven
    shards at the last replica), and all those coordinates; else (one rank apart, or a corner)
    the first dimension the two differ in, and the coordinate of the odd one of them."""
    runs = [r for r in c.runs if r in fingerprints]
    alike = [r for r in runs if not _classes.differences(fingerprints[c.rep], fingerprints[r])]
    unlike = [r for r in runs if r not in alike]
    for i in range(len(mesh.dims)):
        a, b = {mesh.coords(r)[i] for r in alike}, {mesh.coords(r)[i] for r in unlike}
        if not a & b:
            return i, a | b
    rc, wc = mesh.coords(c.rep), mesh.coords(w)
    dim = next(i for i in range(len(rc)) if rc[i] != wc[i])
    return dim, {mesh.coords(_odd_one(mesh, c.rep, w, fingerprints))[dim]}


def _prove(c, mesh, fingerprints: dict) -> tuple | None:
    """Compare `c`'s witnesses with its representative: proven (None), or the dimension to split
    on and the coordinates to take apart there (:func:`_cut`)."""
    rep = fingerprints.get(c.rep)
    if rep is None:
        c.proven, c.why = False, f"its representative, rank {c.rep}, did not finish its run"
        return None
    for w in c.witnesses:
        differ = _classes.differences(rep, fingerprints[w]) if w in fingerprints else ["its run"]
        if differ and rep["error"]:
            if w in fingerprints and fingerprints[w]["error"] == rep["error"]:
                # Failed alike: ranks stopped by an error have done different parts of their work
                # before it (a pipeline stage's sends, a loader's threads), which says nothing
                # of the class; the error is its answer.
                continue
            c.proven = False
            c.why = (
                f"rank {c.rep} failed ({rep['_error_text'][0][:160]}) and rank {w} differs from it in its "
                f"{', '.join(differ)}; a class whose representative fails is not split: fix the error, "
                "or check its members with --ranks"
            )
            return None
        if differ:
            # A witness that fails where the representative ran is split off like any difference
            # (the last replica's empty shard): its part becomes a class that fails, proven by
            # its own witnesses failing alike, and the rest is answered.
            failed = w in fingerprints and fingerprints[w]["error"]
            c.why = (
                f"rank {w} failed where rank {c.rep} ran ({fingerprints[w]['_error_text'][0][:160]})"
                if failed
                else f"rank {w} differs from rank {c.rep} in its {', '.join(differ)}"
            )
            return _cut(c, mesh, w, fingerprints)
    shown = ", ".join(str(w) for w in c.witnesses)
    c.proven = True
    if rep["error"]:
        c.why = f"rank {c.rep} failed ({rep['_error_text'][0][:160]}); witnesses {shown} failed alike"
    else:
        c.why = f"rank {c.rep} run; witnesses {shown} alike" if c.witnesses else f"rank {c.rep} run (the only member)"
    return None


def _step(plan: list, mesh, fingerprints: dict, budget: int) -> tuple:
    """One pass over the pending classes: ([classes], [ranks to run next])."""
    out, todo = [], []
    for c in plan:
        if c.proven is not None:
            out.append(c)
            continue
        found = _prove(c, mesh, fingerprints)
        if found is None:
            out.append(c)
            continue
        dim, cuts = found
        parts = _classes.split(mesh, c, dim, cuts)
        new = sorted({r for p in parts for r in p.runs} - set(fingerprints))
        # counted as run: the whole pipelines of the ranks run, to run and new
        if len(parts) < 2 or len(_classes.lines_of(mesh, {*fingerprints, *todo, *new})) > budget:
            c.proven = False
            c.why += f"; splitting it along {mesh.dims[dim].name} needs more runs than a dry run allows"
            out.append(c)
            continue
        out += parts
        todo += new
    return out, sorted(set(todo))


def _fingerprints(job: Job, ranks, mesh) -> dict:
    out = {}
    for r in ranks:
        rec = _recording(job, r)
        if rec is not None:  # one that failed too: its error is in its fingerprint
            out[r] = _classes.fingerprint(rec, mesh)
    return out


def run_by_classes(job: Job, scheduler, env) -> int:
    """Runs the job by classes; returns the highest exit status of the ranks run."""
    t0 = time.monotonic()
    mailbox.set_running(job.raw_dir, [0], decided=False)  # its peers start once rank 0's groups are known
    scheduler.round([0])
    scheduler.start(0, env(0))
    groups, pipeline = _rank0_groups(job, scheduler)
    mesh = _classes.infer_mesh(groups, job.world, pipeline)
    plan = _classes.plan(mesh)
    todo = _classes.lines_of(mesh, {r for c in plan for r in c.runs})
    _run_round(scheduler, job, todo, env, started=(0,))
    fingerprints: dict = {}
    while any(c.proven is None for c in plan):
        fingerprints.update(_fingerprints(job, set(scheduler.exited) - set(fingerprints), mesh))
        plan, todo = _step(plan, mesh, fingerprints, _classes.MAX_RUNS)
        if todo:
            _run_round(scheduler, job, _classes.lines_of(mesh, todo), env)
    _not_proven_by_values(job, plan)
    _write(job, mesh, plan, scheduler, time.monotonic() - t0)
    return scheduler.finish()


def _not_proven_by_values(job: Job, plan: list) -> None:
    """A class whose representative's run took a branch on a value it did not have is not proven:
    ranks with other data may have taken the other way."""
    for c in plan:
        rec = _recording(job, c.rep) if c.proven else None
        sites = _classes.values_decided(rec) if rec is not None else []
        if sites and len(c.members) > 1:
            c.proven = False
            c.why = f"values decided its run (a branch at {sites[0]}), so other ranks' data may run otherwise"


def _write(job: Job, mesh, plan: list, scheduler, seconds: float) -> None:
    data = {
        "mesh": [{"name": d.name, "size": d.size, "stride": d.stride} for d in mesh.dims],
        "classes": [c.as_data(mesh) for c in plan],
        "runs": sorted(scheduler.exited),
        "nproc_per_node": job.nproc_per_node,  # a rank answered for runs on its local rank's core
        "cost": {"wall_seconds": round(seconds, 1), "host_peak_bytes": scheduler.host_peak},
    }
    with open(os.path.join(job.raw_dir, "classes.json"), "w") as f:
        json.dump(data, f)
