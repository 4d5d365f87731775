"""A dry run by rank classes: one rank per class of ranks doing the same work, the others proven
alike by witnesses, answers the whole job as a run of every rank does."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from torch_neuronx.readiness.launch import classes as C
from torch_neuronx.readiness.launch.job import Job, RankSpec

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "three_d.py"


def _groups(*progressions, world=None):
    """Rank 0's groups: each (desc, stride, size) an arithmetic progression from 0."""
    out = {"0": types.SimpleNamespace(name="0", desc="default_pg", ranks=list(range(world or 1)))}
    for i, (desc, stride, size) in enumerate(progressions, 1):
        out[str(i)] = types.SimpleNamespace(name=str(i), desc=desc, ranks=list(range(0, stride * size, stride)))
    return out


def test_the_mesh_of_a_1024_rank_job_comes_from_rank_0s_groups():
    groups = _groups(("mesh_dp", 256, 4), ("mesh_tp", 1, 32), ("mesh_pp", 32, 8), world=1024)
    mesh = C.infer_mesh(groups, 1024)
    assert [(d.name, d.size, d.stride) for d in mesh.dims] == [("tp", 32, 1), ("pp", 8, 32), ("dp", 4, 256)]
    assert mesh.coords(1023) == (31, 7, 3) and mesh.rank((31, 7, 3)) == 1023
    # groups that do not number every rank: the world is one dimension
    assert [d.name for d in C.infer_mesh(_groups(("mesh_tp", 1, 32), world=1024), 1024).dims] == ["world"]


def test_a_1024_rank_job_runs_whole_pipelines_of_a_few_ranks():
    mesh = C.infer_mesh(_groups(("mesh_dp", 256, 4), ("mesh_tp", 1, 32), ("mesh_pp", 32, 8), world=1024), 1024)
    plan = C.plan(mesh)
    assert len(plan) == 8 + 8  # each rank of rank 0's pipeline, one class per stage
    assert [c.members for c in plan[:8]] == [[s * 32] for s in range(8)] and all(c.proven for c in plan[:8])
    assert sorted(len(c.members) for c in plan[8:]) == [127] * 8
    runs = C.lines_of(mesh, {r for c in plan for r in c.runs})
    # rank 0's pipeline, the last tensor-parallel rank's, the last replica's and the far corner's
    assert len(runs) == 4 * 8 and 1023 in runs
    stage3 = next(c for c in plan if c.fixed == {1: range(3, 4)})
    assert stage3.rep == 96 + 31 and stage3.witnesses == [96 + 768, 96 + 31 + 768]


def test_a_class_splits_on_the_dimension_a_witness_differs_in():
    """The representative's coordinate apart from those before and after it: here the class of
    every rank but 0 (its representative rank 3, the last tensor-parallel rank, as rank 0 is a
    class of its own) splits into tp 3 and tp 0-2."""
    mesh = C.infer_mesh(_groups(("mesh_dp", 4, 2), ("mesh_tp", 1, 4), world=8), 8)
    (_, c) = C.plan(mesh)
    c.why = "rank 7 differs from rank 3 in its ops"
    parts = C.split(mesh, c, mesh.index("tp"))
    assert c.rep == 3 and [p.members for p in parts] == [[3, 7], [1, 2, 4, 5, 6]]
    assert parts[1].rep == 2 and parts[1].witnesses == [4, 6]
    assert all(p.split_because == c.why for p in parts)
    assert [p.as_data(mesh)["coordinates"] for p in parts] == [{"tp": 3}, {"tp": "0-2"}]


def _classes_when_one_rank_logs(logger: int) -> tuple:
    """TP=32 x PP=8 x DP=4 with the loss printed by rank `logger`: (rounds of comparison, the
    classes of the last stage as (first two members, size), pipelines run)."""
    from torch_neuronx.readiness.launch.by_classes import _step

    mesh = C.infer_mesh(_groups(("mesh_dp", 256, 4), ("mesh_tp", 1, 32), ("mesh_pp", 32, 8), world=1024), 1024)
    ok = {"collectives": {}, "graphs": [], "ops": {}, "memory": [], "error": []}
    logs = dict(ok, ops={("aten::_local_scalar_dense", "float32", 4): 2})

    def prints(ranks):
        return {r: logs if r == logger else ok for r in ranks}

    plan = C.plan(mesh)
    seen = prints({r for c in plan for r in c.runs})
    rounds = 0
    while any(c.proven is None for c in plan):
        plan, todo = _step(plan, mesh, seen, C.MAX_RUNS)
        seen.update(prints(todo))
        rounds += 1
    assert all(c.proven for c in plan)
    last = sorted((c.members[:2], len(c.members)) for c in plan if all(mesh.coords(r)[1] == 7 for r in c.members))
    return rounds, last, len(C.lines_of(mesh, seen)) // 8


def test_a_script_that_logs_on_the_first_rank_of_the_last_stage_needs_no_split():
    """Where torchtitan and examples/llama_3d.py print the loss: a rank of rank 0's pipeline, a
    class of its own from the start."""
    assert _classes_when_one_rank_logs(224) == (1, [([224], 1), ([225, 226], 127)], 4)


def test_a_script_that_logs_on_the_last_rank_splits_that_rank_off():
    """`rank == world - 1` (PyTorch's pipelining examples print there): the far corner's witness
    differs from a representative the other witness agrees with, so the split takes the witness's
    data-parallel coordinate apart; there the two ranks run differ on tp, both ends split off:
    two splits, four pipelines more, not a class per coordinate."""
    rounds, last, pipelines = _classes_when_one_rank_logs(1023)
    assert last == [([224], 1), ([225, 226], 95), ([992], 1), ([993, 994], 30), ([1023], 1)]
    assert rounds == 3 and pipelines == 4 + 4


def test_uneven_shards_on_the_last_replica_split_off_that_replica():
    """TP=8 x FSDP=128 where the last FSDP rank's shards are uneven: the runs like the
    representative and those unlike it share no data-parallel coordinate, so both ends of it are
    split off (not one coordinate per round): 9 ranks run in all."""
    from torch_neuronx.readiness.launch.by_classes import _step

    mesh = C.infer_mesh(_groups(("mesh_dp", 8, 128), ("mesh_tp", 1, 8), world=1024), 1024)
    ok = {"collectives": {}, "graphs": [], "ops": {}, "memory": [], "error": []}
    uneven = dict(ok, memory=[(100, 128)])

    def prints(ranks):
        return {r: uneven if mesh.coords(r)[1] == 127 else ok for r in ranks}

    plan = C.plan(mesh)
    seen = prints({r for c in plan for r in c.runs})
    plan, todo = _step(plan, mesh, seen, C.MAX_RUNS)
    seen.update(prints(todo))
    plan, todo = _step(plan, mesh, seen, C.MAX_RUNS)
    assert todo == [] and all(c.proven for c in plan) and len(seen) == 9
    assert sorted((c.members[0], len(c.members)) for c in plan) == [(0, 1), (1, 7), (8, 1008), (1016, 8)]


def test_a_failing_witness_splits_off_the_ranks_that_fail():
    """TP=4 x FSDP=256 where the last FSDP rank's shard is empty and its ranks fail (transformers
    loading a strided shard): the witness there fails where the representative ran, the class is
    split at that coordinate like any difference, and the failing part is a class of its own,
    proven by its witness failing alike: every rank is answered, 4 of them failing."""
    from torch_neuronx.readiness.launch.by_classes import _step

    mesh = C.infer_mesh(_groups(("mesh_dp", 4, 256), ("mesh_tp", 1, 4), world=1024), 1024)
    ok = {"collectives": {}, "graphs": [], "ops": {}, "memory": [], "error": []}
    failing = dict(ok, error=["IndexError"], _error_text=["IndexError: list index out of range"])

    def prints(ranks):
        return {r: failing if mesh.coords(r)[1] == 255 else ok for r in ranks}

    plan = C.plan(mesh)
    seen = prints({r for c in plan for r in c.runs})
    assert any(seen[w]["error"] for c in plan for w in c.witnesses)
    plan, todo = _step(plan, mesh, seen, C.MAX_RUNS)
    assert todo  # the parts' representatives and witnesses
    seen.update(prints(todo))
    plan, todo = _step(plan, mesh, seen, C.MAX_RUNS)
    assert todo == [] and all(c.proven for c in plan), [(c.members[:3], c.why) for c in plan]
    assert sorted(r for c in plan if seen[c.rep]["error"] for r in c.members) == [1020, 1021, 1022, 1023]
    assert sorted(r for c in plan for r in c.members) == list(range(1024))


def test_a_failing_representative_is_answered_by_witnesses_failing_alike():
    """Ranks stopped by an error differ in what they did before it (a pipeline stage's sends, a
    loader's threads): a class whose representative and witnesses fail with one error is proven to
    fail (torchtitan at TP=32 with 8 KV heads: every rank fails in its first forward); a witness
    that fails otherwise, or runs, leaves it not proven, and it is not split."""
    from torch_neuronx.readiness.launch.by_classes import _step

    mesh = C.infer_mesh(_groups(("mesh_dp", 4, 256), ("mesh_tp", 1, 4), world=1024), 1024)
    plan = C.plan(mesh)
    ok = {"collectives": {}, "graphs": [], "ops": {}, "memory": [], "error": []}
    prints = {r: dict(ok, error=["RuntimeError"], _error_text=["RuntimeError: shape"]) for c in plan for r in c.runs}
    for r in prints:
        prints[r]["collectives"] = {("allgather", r % 4): 1}
    plan, todo = _step(C.plan(mesh), mesh, prints, C.MAX_RUNS)
    assert todo == [] and all(c.proven for c in plan)
    assert all("failed alike" in c.why and "RuntimeError" in c.why for c in plan if c.witnesses)
    witness = max(w for c in plan for w in c.witnesses)
    for other in (dict(ok), dict(ok, error=["IndexError"], _error_text=["IndexError: list"])):
        prints[witness] = other
        plan, todo = _step(C.plan(mesh), mesh, prints, C.MAX_RUNS)
        (c,) = [c for c in plan if witness in c.witnesses]
        assert todo == [] and c.proven is False and "is not split" in c.why
    # a witness that differs without failing still splits its class (here along tp)
    prints = {r: dict(ok) for c in plan for r in c.runs}
    prints[1020] = dict(ok, ops={("aten::mm", "float32", 4): 1})
    before = C.plan(mesh)
    plan, todo = _step(before, mesh, prints, C.MAX_RUNS)
    assert len(plan) > len(before) and todo


def _by_classes_and_every_rank(tmp_path, script, nproc: int) -> tuple:
    """The reports of a dry run of `script` on `nproc` ranks by classes and of every rank."""
    reports = {}
    for mode in ("classes", "all"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", "trn2.48xlarge"]
        cmd += ["--ranks", mode, "--out", str(out), "--", "torchrun", "--nproc-per-node", str(nproc), str(script)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        reports[mode] = json.loads((out / "report.json").read_text())
    by_classes, every = reports["classes"], reports["all"]
    assert by_classes["ranks_not_run"] == every["ranks_not_run"] == [] and every["classes"] is None
    return by_classes, every


def test_a_pipeline_on_the_default_group_is_the_whole_world_as_one_dimension():
    """Stages built without a group of their own (PyTorch's pipelining tutorial): every rank is a
    stage, so the world is the pipeline dimension and each rank is run, none left to a class."""
    mesh = C.infer_mesh(_groups(world=4), 4, pipeline=[0, 1, 2, 3])
    assert [(d.name, d.size, d.pipeline) for d in mesh.dims] == [("default_pg", 4, True)]
    assert [c.members for c in C.plan(mesh)] == [[0], [1], [2], [3]]
    assert not C.infer_mesh(_groups(world=4), 4).dims[0].pipeline  # without a pipeline: one class


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_pipeline_on_the_default_group_dry_runs_by_classes(tmp_path):
    """Four stages on the default group: by classes as by every rank (no rank left out of its
    pipeline, so every stage gets its neighbours' messages)."""
    by_classes, every = _by_classes_and_every_rank(tmp_path, Path(__file__).parent / "scripts" / "four_stages.py", 4)
    assert by_classes["across_ranks"]["findings"] == every["across_ranks"]["findings"] == []
    assert by_classes["memory_per_rank"] == every["memory_per_rank"]
    steps = [[e["step_seconds"] for e in r["estimates"]] for r in (by_classes, every)]
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_dry_run_by_classes_answers_as_one_of_every_rank(tmp_path):
    """TP=2 x PP=2 x DP=2 (a 1F1B pipeline of tensor-parallel stages, data-parallel gradients): the
    report from classes equals the report from every rank (per-rank peaks, collectives, findings,
    step time). (At this size the classes' pipelines are all four of the job's; at 1,024 ranks, 4 of
    128: test_a_1024_rank_job_runs_whole_pipelines_of_a_few_ranks.)"""
    by_classes, every = _by_classes_and_every_rank(tmp_path, SCRIPT, 8)
    assert all(c["proven"] for c in by_classes["classes"]["classes"])
    for key in ("memory_per_rank", "collectives", "verdict"):
        assert by_classes[key] == every[key], key
    assert by_classes["across_ranks"]["findings"] == every["across_ranks"]["findings"] == []
    steps = [[e["step_seconds"] for e in r["estimates"]] for r in (by_classes, every)]
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_that_branches_splits_its_class_and_is_found(tmp_path):
    """The last rank issues one all-reduce more: the witness at the far corner of its class differs,
    the class splits, and the comparison across ranks names the hang."""
    job = Job(str(tmp_path / "raw"), [str(SCRIPT), "branch"], dry_run=True, nproc_per_node=8, workers=2)
    cmd = [sys.executable, "-m", "torch_neuronx.readiness.launch.scheduler", "--job", job.save()]
    env = dict(os.environ, TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    found = json.loads((tmp_path / "raw" / "classes.json").read_text())
    last = next(c for c in found["classes"] if 7 in c["ranks"])
    assert last["ranks"] == [7] and last["proven"]  # split off the others of its stage
    assert 7 in found["runs"] and RankSpec() == job.ranks


def test_two_ranks_that_fail_alike_on_their_own_cores_have_one_fingerprint():
    """An out-of-memory error names the rank's own core: the type is compared, the message shown."""
    mesh = C.infer_mesh(_groups(("mesh_tp", 1, 32), world=32), 32)

    def rec(rank, core):
        error = f"OutOfMemoryError: Neuron out of memory. Tried to allocate 62.62 MiB on neuron:{core}"
        compile_ = types.SimpleNamespace(graphs=[])
        return types.SimpleNamespace(rank=rank, groups={}, buckets=[], compile=compile_, memory={}, error=error)

    a, b = C.fingerprint(rec(0, 0), mesh), C.fingerprint(rec(31, 31), mesh)
    assert C.differences(a, b) == [] and a["error"] == ["OutOfMemoryError"]
    assert b["_error_text"] == ["OutOfMemoryError: Neuron out of memory. Tried to allocate 62.62 MiB on neuron:31"]
    assert C.differences(a, dict(a, error=["ValueUnknownError"])) == ["error"]


def test_compiled_graphs_of_alike_ranks_on_other_cores_are_alike():
    """A compiled graph's inputs name the core they are on (neuron:1, neuron:30): two tensor-parallel
    ranks of one stage compile the same graph on their own cores, which does not split their class."""
    mesh = C.infer_mesh(_groups(("mesh_tp", 1, 32), world=32), 32)

    def rec(rank):
        shapes = [[[1, 256, 8192], "bfloat16", f"neuron:{rank}"], "DeviceMesh"]
        compile_ = types.SimpleNamespace(graphs=[{"graph": "inductor_0", "shapes": shapes}])
        return types.SimpleNamespace(rank=rank, groups={}, buckets=[], compile=compile_, memory={}, error=None)

    assert not C.differences(C.fingerprint(rec(1), mesh), C.fingerprint(rec(30), mesh))
    other = rec(30)
    other.compile.graphs[0]["shapes"][0][0] = [1, 512, 8192]
    assert C.differences(C.fingerprint(rec(1), mesh), C.fingerprint(other, mesh)) == ["graphs"]


def test_groups_of_one_kind_are_compared_by_their_work_not_their_names():
    """torchtitan builds three meshes, each with a pp group of its own; a rank sends on one of them.
    Group names number the groups in the order the job made them ("1", "1409", "2753" on rank 0;
    "2", "1410", "2754" on rank 1), and sort apart as strings: two ranks doing the same work are alike
    however their groups are named, and unlike when their work differs."""
    mesh = C.infer_mesh(_groups(("mesh_tp", 1, 8), ("mesh_pp", 128, 8), world=1024), 1024)

    def rec(rank, names, sends=1):
        entry = types.SimpleNamespace(op="send", dtype="bfloat16", reduce_op=None, agreed=[4 << 20], peer=rank + 128)
        groups = {
            n: types.SimpleNamespace(name=n, desc="mesh_pp", ranks=list(range(rank, 1024, 128)),
                                     entries=[entry] * sends if i == 0 else [])
            for i, n in enumerate(names)
        }  # fmt: skip
        compile_ = types.SimpleNamespace(graphs=[])
        return types.SimpleNamespace(rank=rank, groups=groups, buckets=[], compile=compile_, memory={}, error=None)

    a, b = rec(0, ["1", "1409", "2753"]), rec(1, ["2", "1410", "2754"])
    assert sorted(b.groups)[0] == "1410"  # the group rank 1 sends on sorts second by name
    assert C.differences(C.fingerprint(a, mesh), C.fingerprint(b, mesh)) == []
    assert C.differences(C.fingerprint(a, mesh), C.fingerprint(rec(1, ["2", "1410", "2754"], sends=2), mesh)) == [
        "collectives"
    ]


def test_host_memory_counts_the_pages_forked_ranks_share_once():
    """The dry run's host memory sums its processes' proportional set sizes: the ranks are forked
    from a parent that imported the script's modules, and their resident sizes would count those
    shared pages once per rank (16.7 GiB for 32 torchtitan ranks whose proportional set sizes
    summed to 9.6)."""
    from torch_neuronx.readiness.launch.scheduler import pss_bytes

    block = bytearray(256 << 20)
    block[::4096] = b"\1" * (len(block) // 4096)  # every page resident, shared with the forks below
    r, w = os.pipe()
    kids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)
            os._exit(0)
        kids.append(pid)
    try:
        with open("/proc/self/statm") as f:
            own_rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        total = sum(pss_bytes(pid) for pid in [os.getpid(), *kids])
    finally:
        os.write(w, b"x" * len(kids))
        for pid in kids:
            os.waitpid(pid, 0)
    assert own_rss > 256 << 20
    # the block once, not five times (each fork has a few private pages of its own)
    assert total < own_rss + len(kids) * (16 << 20), (total, own_rss)
