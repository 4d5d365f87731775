"""DDP in a dry run: what it does that costs memory or time, as a real run does it, and the rule for
the values of collectives (every rank is taken to hold this rank's values), which a dry run lists."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torch_neuronx

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def test_collectives_return_what_every_rank_would_if_it_held_this_ranks_values():
    with torch_neuronx.readiness(dry_run=True, rank=1, world_size=4) as r:
        dist.init_process_group("neuron")
        total = torch.tensor([3], device="neuron")
        dist.all_reduce(total)
        gathered = [torch.zeros(1, dtype=torch.long, device="neuron") for _ in range(4)]
        dist.all_gather(gathered, torch.tensor([7], device="neuron"))
        seed = torch.tensor([5], device="neuron")
        dist.broadcast(seed, src=0)
        got = (total.item(), [g.item() for g in gathered], seed.item())
    assert got == (12, [7, 7, 7, 7], 5)
    assumed = {
        (a["check"], a["site"].split(":")[0].endswith("test_ddp.py")) for a in r.report.data["dry_run"]["assumed"]
    }
    assert assumed == {("allreduce", True), ("allgather", True), ("broadcast", True)}
    assert "as if every rank held this rank's values" in r.report.to_markdown()


def _check(tmp_path, dry: bool, *args) -> dict:
    out = tmp_path / ("dry" if dry else "real")
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out)] + (["--dry-run"] if dry else [])
    cmd += ["--", "torchrun", "--standalone", "--nproc-per-node", "2", str(SCRIPT), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0 or "disagree" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "args",
    [(), ("--unused", "--bucket-view"), ("--hook", "fp16"), ("--static-graph", "--hook", "powersgd")],
    ids=["buckets-no_sync", "unused-bucket_view", "fp16_compress_hook", "static_graph-powerSGD"],
)
def test_a_ddp_dry_run_agrees_with_the_real_run(tmp_path, args):
    real, dry = _check(tmp_path, False, *args), _check(tmp_path, True, *args)
    assert real["verdict"] == dry["verdict"] == "runs natively"
    key = lambda r: sorted(
        (c["kind"], c["dtype"], c["bytes"], c["group_size"], c["calls_per_step"]) for c in r["collectives"]
    )  # noqa: E731
    assert key(dry) == key(real) != []  # the gradient buckets' all-reduces (and DDP's rebuild of them)
    for d, r in zip(dry["memory_per_rank"], real["memory_per_rank"]):  # buckets and their views included
        assert abs(d["peak_allocated"] - r["peak_allocated"]) <= 0.01 * r["peak_allocated"], (d, r)
    # the values the dry run assumed: the seed's broadcast and DDP's checks that ranks built one model
    assumed = {(a["check"], a["site"].rsplit("/", 1)[-1]) for a in dry["dry_run"]["assumed"]}
    assert ("broadcast", f"{SCRIPT.name}:{_line('dist.broadcast(seed')} (<module>)") in assumed
    assert {"allgather", "broadcast"} <= {c for c, _ in assumed}
    assert real["across_ranks"]["findings"] == dry["across_ranks"]["findings"] == []


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ranks_that_build_different_models_are_not_hidden_by_the_assumed_values(tmp_path):
    dry = _check(tmp_path, True, "--different-models")
    assert dry["verdict"].startswith("collectives disagree: group 0 (default_pg): rank 1 issued broadcast")
    assert f"{SCRIPT.name}:{_line('model = DDP(')}" in dry["verdict"]  # DDP's broadcast of the parameters


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in text)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_hugging_face_trainer_under_torchrun_runs_in_a_dry_run(tmp_path):
    """The Trainer's default multi-process path (DDP through Accelerate) completes in a dry run with
    the collectives of the real run."""
    script = Path(__file__).parent / "scripts" / "trainer_ddp.py"
    reports = {}
    for mode in ("real", "dry"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out)]
        cmd += (["--dry-run"] if mode == "dry" else []) + ["--", "torchrun", "--standalone", "--nproc-per-node", "2"]
        p = subprocess.run(cmd + [str(script), str(tmp_path / f"{mode}-out")], capture_output=True, text=True,
                           timeout=600, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        reports[mode] = json.loads((out / "report.json").read_text())
    real, dry = reports["real"], reports["dry"]
    assert real["verdict"] == dry["verdict"] == "runs natively" and dry["steps"] == real["steps"] == 3
    key = lambda r: sorted(
        (c["kind"], c["dtype"], c["bytes"], c["group_size"], c["calls_per_step"]) for c in r["collectives"]
    )  # noqa: E731
    assert key(dry) == key(real) != []
