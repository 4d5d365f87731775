"""Object collectives in a dry run: every rank's object is taken to be this rank's, as every rank's
tensor is, and each call is listed among the assumed collectives."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torch_neuronx
from torch_neuronx.readiness import ValueUnknownError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "object_collectives.py"


def test_object_collectives_give_this_ranks_objects_and_are_listed():
    with torch_neuronx.readiness(dry_run=True, rank=1, world_size=2) as r:
        dist.init_process_group("neuron")
        everyone = [None, None]
        dist.all_gather_object(everyone, {"rank": 1})
        config = [None]
        dist.broadcast_object_list(config, src=0)  # this rank's list stays as it is
        gathered = [None, None]
        dist.gather_object(("mine", 1), gathered, dst=1)
        share = [None]
        dist.scatter_object_list(share, ["zero", "one"], src=0)
        dist.destroy_process_group()
    assert (everyone, config, gathered, share) == ([{"rank": 1}] * 2, [None], [("mine", 1)] * 2, ["one"])
    assumed = [(a["check"], a["count"]) for a in r.report.data["dry_run"]["assumed"]]
    assert sorted(assumed) == [(n, 1) for n in sorted(("all_gather_object", "broadcast_object_list",
                                                         "gather_object", "scatter_object_list"))]  # fmt: skip
    assert all(Path(a["site"].split(":")[0]).name == Path(__file__).name for a in r.report.data["dry_run"]["assumed"])
    # the patched functions are the dry run's only
    assert dist.all_gather_object is torch.distributed.distributed_c10d.all_gather_object
    assert dist.all_gather_object.__module__ == "torch.distributed.distributed_c10d"


def test_a_scatter_this_rank_has_no_input_for_stops_at_its_line():
    with pytest.raises(ValueUnknownError, match=r"scatter_object_list at .*test_object_collectives.py:\d+"):
        with torch_neuronx.readiness(dry_run=True, rank=1, world_size=2):
            dist.init_process_group("neuron")
            try:
                dist.scatter_object_list([None], None, src=0)
            finally:
                dist.destroy_process_group()


def test_a_recv_object_list_whose_sender_does_not_run_stops_at_its_line():
    """The receiver has no objects of its own to take: without the sender's, the dry run stops there."""
    with pytest.raises(ValueUnknownError) as e:
        with torch_neuronx.readiness(dry_run=True, rank=1, world_size=2) as r:
            dist.init_process_group("neuron")
            try:
                dist.recv_object_list([None], src=0)
            finally:
                dist.destroy_process_group()
    msg = str(e.value)
    assert re.search(r"recv_object_list at .*test_object_collectives.py:\d+ .* receives rank 0's objects, and "
                     r"rank 0 does not run in this dry run: .* Include rank 0 in --ranks", msg), msg  # fmt: skip
    assert not r.report.data["dry_run"]["assumed"]  # nothing was taken for the objects


@pytest.mark.slow
@pytest.mark.multiprocess
def test_object_collectives_under_torchrun_in_a_dry_run(tmp_path):
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--out", str(out), "--"]
    cmd += ["torchrun", "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, g in enumerate(got):
        mine = {"rank": r, "name": "r" * (5 + 40 * r)}
        assert g["everyone"] == [mine, mine]
        assert g["share"] == [{"part": r}]
    assert got[0]["config"] == [{"lr": 0.1, "seed": 7}] and got[1]["config"] == [None]
    assert got[0]["gathered"] == [got[0]["everyone"][0]] * 2 and got[1]["gathered"] is None
    rep = json.loads((out / "report.json").read_text())
    # the byte counts differ by rank (each pickled its own objects): no finding for them
    assert rep["across_ranks"]["findings"] == []
    assumed = {a["check"] for a in rep["dry_run"]["assumed"]}
    assert {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"} <= assumed
    # point to point: the sender's real objects and known value, not assumed
    assert got[1]["received"] == [{"shapes": [[2, 16, 64]]}, "from 0", 7] and got[0]["received"] == [["back", 1]]
    assert not {"send_object_list", "recv_object_list", "send", "recv"} & assumed


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_recv_object_list_from_a_rank_left_out_of_the_dry_run_stops_at_its_line(tmp_path):
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--ranks", "1", "--out", str(out), "--"]
    cmd += ["torchrun", "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode != 0, p.stdout[-2000:] + p.stderr[-4000:]
    line = next(i for i, t in enumerate(SCRIPT.read_text().splitlines(), 1) if "# RECV FROM 0" in t)
    (rec,) = [json.loads(f.read_text()) for f in (out / "recordings").glob("rank*.json")]
    assert rec["rank"] == 1
    assert rec["error"].startswith("ValueUnknownError: dry run: recv_object_list at "), rec["error"]
    assert f"{SCRIPT.name}:{line} " in rec["error"], rec["error"]
    assert "rank 0 does not run in this dry run" in rec["error"] and "Include rank 0 in --ranks" in rec["error"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ranks_that_receive_from_each_other_first_stop_at_once_where_the_job_would_hang(tmp_path):
    """With --workers 1, rank 1 starts while rank 0 waits for it (a rank that waits is not counted);
    then both wait for a message neither sends: they stop with ValueUnknownError, not after a timeout."""
    script = tmp_path / "each_other.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('neuron')\n"
        "got = [None]\n"
        "dist.recv_object_list(got, src=1 - dist.get_rank())\n"
    )
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--workers", "1", "--out", str(out), "--"]
    cmd += ["torchrun", "--standalone", "--nproc-per-node", "2", str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode != 0, p.stdout[-2000:] + p.stderr[-4000:]
    recs = sorted((json.loads(f.read_text()) for f in (out / "recordings").glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert r["error"].startswith("ValueUnknownError: dry run: recv_object_list at "), r["error"]
        assert "each_other.py:4 " in r["error"] and "would hang here" in r["error"], r["error"]
    # the first to stop was told so while the other still waited (the other may see it exit first)
    assert any("every rank running waits for another's message" in r["error"] for r in recs), recs
