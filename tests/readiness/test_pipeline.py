"""A pipeline-parallel step in a recording: the schedule's order for every micro-batch, each
action timed as its stage's, composed along the critical path; a dry run runs the micro-batches of
a 1F1B step that differ and times the step the script asked for."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx
from helpers import REPO
from torch_neuronx.readiness._torch_private import one_f_one_b_order as _one_f_one_b
from torch_neuronx.readiness.dry import pipeline as dry_pipeline
from torch_neuronx.readiness.estimate import pipeline
from torch_neuronx.readiness.estimate.pipeline import StageTimes


def test_the_critical_path_of_1f1b_is_its_slots_by_hand():
    # 2 stages, 4 micro-batches, forward 1 s and backward 2 s each: M + P - 1 = 5 slots of 3 s
    order = {s: _one_f_one_b(s, 2, 4) for s in range(2)}
    stages = {s: StageTimes({"F": [1.0], "B": [2.0]}) for s in range(2)}
    assert pipeline.critical_path(order, stages) == pytest.approx(15.0)
    assert pipeline.busiest_rank(order, stages) == pytest.approx(12.0)  # 3 s of bubble
    # a send of 0.5 s between the ranks: on the critical path twice per micro-batch's round trip
    assert pipeline.critical_path(order, stages, hop_seconds=0.5) > 15.0
    # GPipe's order: every forward, then every backward
    gpipe = {s: [(s, "F", m) for m in range(4)] + [(s, "B", m) for m in range(4)] for s in range(2)}
    assert pipeline.critical_path(gpipe, stages) == pytest.approx(1 + 4 * 1 + 4 * 2 + 2)


def test_an_order_that_cannot_complete_is_an_error():
    order = {0: [(0, "B", 0)], 1: [(1, "B", 0)]}  # each waits for the other's backward
    with pytest.raises(ValueError, match="cannot complete"):
        pipeline.critical_path(order, {0: StageTimes({"B": [1.0]}), 1: StageTimes({"B": [1.0]})})


def _pipeline_step(n_microbatches: int):
    """A one-stage 1F1B schedule's two steps, as a script writes them."""
    import torch.distributed as dist
    from torch.distributed import pipelining as pp

    dev = torch.device("neuron", 0)
    stage_module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)).to(dev)
    stage = pp.PipelineStage(stage_module, 0, 1, dev, input_args=(torch.empty(2, 64, device=dev),))
    schedule = pp.Schedule1F1B(stage, n_microbatches=n_microbatches, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    x = torch.randn(2 * n_microbatches, 64, device=dev)
    losses = []
    for _ in range(2):
        losses.clear()
        out = schedule.step(x, target=x, losses=losses)
        opt.step()
        opt.zero_grad()
    assert dist.is_initialized()
    return losses, out


def _dry_run(n_microbatches: int):
    import torch.distributed as dist

    with torch_neuronx.readiness(dry_run=True, rank=0, world_size=1) as r:
        dist.init_process_group("neuron")
        losses, out = _pipeline_step(n_microbatches)
    return r, losses, out


def test_a_dry_run_1f1b_step_runs_the_microbatches_that_differ_and_times_them_all(monkeypatch):
    import torch.distributed as dist

    with torch_neuronx.readiness() as real:  # first: a dry run's leftovers would count in it
        dist.init_process_group("neuron", rank=0, world_size=1, store=dist.HashStore())
        try:
            _pipeline_step(16)
        finally:
            dist.destroy_process_group()
    r, losses, out = _dry_run(16)
    p = r.recording.pipeline
    assert (p.schedule, p.microbatches, p.stages) == ("Schedule1F1B", 16, 1)
    assert p.ran == {"0:F": 3, "0:B": 3}  # the last step: at least 3 of 16 micro-batches
    assert len(losses) == 16 and tuple(out.shape) == (32, 64)  # what the script asked for
    assert len(p.order[0]) == 2 * 16
    # the peak of the real run of all 16, within 1%
    real_peak, dry_peak = (x.report.data["memory"][0]["peak_allocated"] for x in (real, r))
    assert dry_peak == pytest.approx(real_peak, rel=0.01)
    del losses, out
    # the same dry run with every micro-batch run: the same step time
    monkeypatch.setattr(dry_pipeline, "microbatches_to_run", lambda name, n, stages, stage: n)
    full, _, _ = _dry_run(16)
    assert full.recording.pipeline.ran == {"0:F": 16, "0:B": 16}
    shortened, every = (x.report.data for x in (r, full))
    # within 1%: the shortened step merges its micro-batches' outputs, then repeats them to full size
    assert shortened["estimates"][0]["step_seconds"] == pytest.approx(every["estimates"][0]["step_seconds"], rel=1e-2)
    # and the same FLOPs, so the same MFU: the micro-batches not run count as the run ones
    for key in ("model_flops", "mfu"):
        assert shortened["estimates"][0][key] == pytest.approx(every["estimates"][0][key], rel=1e-2), key
    # and the same terms: the shares are of the step's micro-batches, not of those run
    for key in ("shares", "term_shares"):
        a, b = shortened["estimates"][0][key], every["estimates"][0][key]
        assert a == pytest.approx(b, abs=2e-3), key  # of the micro-batches run: 0.006 off


@pytest.mark.slow
@pytest.mark.multiprocess
def test_stages_that_run_fewer_microbatches_answer_as_every_microbatch(tmp_path):
    """Four 1F1B stages of 8 micro-batches: a dry run runs 5, 4, 3 and 3 of them; no stage waits for
    a message, sends and receives pair up, and every stage's peak and the step time are those of a
    dry run of every micro-batch."""
    script = Path(__file__).parent / "scripts" / "four_stages.py"
    reports, ran = {}, {}
    for mode in ("shortened", "every"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", "trn2.48xlarge"]
        cmd += ["--out", str(out), "--", "torchrun", "--nproc-per-node", "4", str(script)]
        cmd += ["every"] if mode == "every" else []
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        reports[mode] = json.loads((out / "report.json").read_text())
        recs = [json.loads((out / "recordings" / f"rank{r}.json").read_text()) for r in range(4)]
        ran[mode] = [rec["pipeline"]["ran"][f"{r}:F"] for r, rec in enumerate(recs)]
    assert ran == {"shortened": [5, 4, 3, 3], "every": [8, 8, 8, 8]}
    shortened, every = reports["shortened"], reports["every"]
    assert shortened["across_ranks"]["findings"] == every["across_ranks"]["findings"] == []
    peaks = [[m["peak_allocated"] for m in r["memory_per_rank"]] for r in (shortened, every)]
    assert peaks[0] == pytest.approx(peaks[1], rel=0.01)
    steps = [max(e["step_seconds"] for e in r["estimates"]) for r in (shortened, every)]
    assert steps[0] == pytest.approx(steps[1], rel=0.01)
