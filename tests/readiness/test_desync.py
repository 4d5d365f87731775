"""Collectives compared across ranks: a dry run finds the distributed bugs that hang a job, with the
rank and the line, and says nothing of correct scripts."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from neuronsim import collectives
from torch_neuronx.readiness.record.recording import CollectiveEntry, GroupLog, Recording
from torch_neuronx.readiness.report import desync as _desync

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "desync.py"


def _line(marker: str) -> str:
    """`desync.py:N` of the script's line that holds `marker`."""
    lines = SCRIPT.read_text().splitlines()
    return f"desync.py:{next(i for i, text in enumerate(lines, 1) if marker in text)}"


# -- the comparison, on recordings made here -------------------------------------------------------
def _rec(rank: int, *groups, error=None) -> Recording:
    return Recording(rank=rank, world_size=4, groups={g.name: g for g in groups}, error=error)


def _log(ops, ranks=(0, 1), name="0", desc="default_pg") -> GroupLog:
    """ops: (op, shape) or (op, shape, peer) in order; the shape is the call's one tensor, which is
    its agreed argument (as the recorder notes it) where the collective has one."""
    entries = [
        CollectiveEntry(i, o[0], [list(o[1])], "float32", "sum" if "reduce" in o[0] else None,
                        o[2] if len(o) > 2 else None, f"t.py:{10 + i} (f)", _agreed(o[0], o[1]))
        for i, o in enumerate(ops, 1)
    ]  # fmt: skip
    return GroupLog(name, desc, list(ranks), entries)


def _agreed(op: str, shape) -> tuple:
    return ((math.prod(shape), "float32"),) if collectives.agreed_argument(op) is not None else ()


def test_ranks_that_agree_have_no_finding():
    ops = [("allreduce", (4,)), ("barrier", (1,))]
    assert _desync.find([_rec(0, _log(ops)), _rec(1, _log(ops))]) == []


def test_a_skipped_collective_is_a_hang_named_by_rank_and_line():
    full = [("allreduce", (4,)), ("barrier", (1,)), ("allreduce", (8,))]
    (f,) = _desync.find([_rec(0, _log(full)), _rec(1, _log([full[0], full[2]]))])
    assert f.kind == "hang" and f.message.startswith("group 0 (default_pg): rank 1 never issues barrier #2")
    assert "at t.py:12 (f), which rank 0 issues: rank 0 would wait for it" in f.message


def test_ops_that_may_differ_in_shape_by_rank_do_not_alarm():
    # all-to-all with uneven splits (expert parallelism): shapes differ on purpose
    a = [("alltoall_base", (6,)), ("allreduce", (4,))]
    b = [("alltoall_base", (2,)), ("allreduce", (4,))]
    assert _desync.find([_rec(0, _log(a)), _rec(1, _log(b))]) == []
    # gather: only its input is agreed on; the root alone passes the outputs
    root = CollectiveEntry(1, "gather", [[3], [3], [3]], "float32", None, None, "t.py:11 (f)", ((3, "float32"),))
    other = root._replace(shapes=[[3]])
    recs = [_rec(0, GroupLog("0", "default_pg", [0, 1], [root])), _rec(1, GroupLog("0", "default_pg", [0, 1], [other]))]
    assert _desync.find(recs) == []


def test_the_matching_rule_compares_element_counts_not_shapes():
    # as NCCL and gloo move elements: [4, 8] against [32] runs, [4, 8] against [4, 4] does not
    assert _desync.find([_rec(0, _log([("allreduce", (4, 8))])), _rec(1, _log([("allreduce", (32,))]))]) == []
    (f,) = _desync.find([_rec(0, _log([("allreduce", (4, 8))])), _rec(1, _log([("allreduce", (4, 4))]))])
    assert f.kind == "disagree" and f.ranks and f.sites


def test_a_rank_that_failed_is_not_said_to_hang():
    full = [("allreduce", (4,)), ("allreduce", (4,))]
    recs = [_rec(0, _log(full)), _rec(1, _log(full[:1]), error="RuntimeError: boom")]
    assert _desync.find(recs) == []


def test_ranks_not_run_are_not_compared():
    # a dry run of ranks 0 and 2 of a 4-rank group: the others' collectives are unknown
    ops = [("allreduce", (4,))]
    recs = [_rec(0, _log(ops, ranks=(0, 1, 2, 3))), _rec(2, _log(ops, ranks=(0, 1, 2, 3)))]
    assert _desync.find(recs) == []


def test_pipeline_sends_and_receives_are_matched_per_pair():
    sends = [("send", (4,), 1)] * 2
    recvs = [("recv", (4,), 0)] * 2
    assert _desync.find([_rec(0, _log(sends)), _rec(1, _log(recvs))]) == []
    (f,) = _desync.find([_rec(0, _log(sends[:1])), _rec(1, _log(recvs))])
    assert f.kind == "hang" and "rank 1 waits in recv #2 [4] float32 at t.py:12 (f) from rank 0" in f.message


def test_members_that_disagree_on_a_group_are_found():
    (f,) = _desync.find([_rec(0, _log([], ranks=(0,), name="1")), _rec(1, _log([], ranks=(0, 1), name="1"))])
    assert f.kind == "disagree" and "rank 0 made it with members [0]; rank 1 made it with members [0, 1]" in f.message


# -- found by a dry run of the script, as a user runs it ----------------------------------------------
CASES = {
    "ok": None,
    "skip_barrier": ("hang", "will hang", "rank 1 never issues barrier #2 [1] uint8 at", _line("only rank 0 waits")),
    "uneven_batches": ("hang", "will hang", "rank 0 never issues allreduce #5 [4] float32 (sum)", _line("a * step")),
    "swapped": ("disagree", "collectives disagree", "rank 1 issued allreduce #5 [8] float32", _line("dist.all_reduce(b)")),
    "shapes": ("disagree", "collectives disagree", "issued allreduce #5 [8] float32", _line("a if rank == 0 else b")),
    "membership": ("disagree", "collectives disagree", "rank 0 made it with members [0]; rank 1 made it with", None),
    "missing_send": ("hang", "will hang", "rank 1 waits in recv #7 [4] float32", _line("dist.recv(a, src=0)")),
    "last_batch": ("graphs", "will hang", "rank 1 ran a compiled graph for inputs [8, 8] float32, [8] float32, [3, 8]",
                   _line("step_fn(torch.ones")),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_finds_the_bug_with_its_rank_and_line(case, tmp_path):
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--out", str(out), "--"]
    cmd += ["torchrun", "--standalone", "--nproc-per-node", "2", str(SCRIPT), case]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    findings = report["across_ranks"]["findings"]
    if CASES[case] is None:
        assert findings == [] and report["verdict"] == "runs natively"
        return
    kind, verdict, what, line = CASES[case]
    (f,) = findings
    assert f["kind"] == kind and what in f["message"], f
    assert line is None or line in f["message"], (line, f["message"])
    assert report["verdict"].startswith(f"{verdict}: ") and what in report["verdict"]
    assert f["message"][:60] in p.stdout  # the terminal summary says it too
