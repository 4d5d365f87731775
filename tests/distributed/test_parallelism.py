"""Pipeline, expert and context parallelism on neuron, each checked against a single-core run
of the same seeded model and data (losses / outputs and gradients). The workers in ./workers
run under torchrun and state their tolerances."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import worker_env

WORKERS = Path(__file__).parent / "workers"


def torchrun(nproc, script, *args, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = worker_env()
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    p = subprocess.run(
        [*cmd, str(WORKERS / script), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{script} failed (rc {p.returncode}):\n{out[-6000:]}"
    return p.stdout


PP_SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
# Manual splits of every schedule, pipeline() tracing, and compiled stages.
PP_CASES = PP_SCHEDULES + ["GPipe:traced", "1F1B:traced", "1F1B:compile"]


def _check_cases(out, cases, nproc):
    for case in cases:
        assert out.count(f"CASE {case} OK") == nproc, f"{case}:\n{out[-4000:]}"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4], ids=["2proc", "4proc"])
def test_pipeline_schedules_match_single_core(nproc):
    out = torchrun(nproc, "pipeline_worker.py", ",".join(PP_CASES))
    _check_cases(out, PP_CASES, nproc)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pipeline_uneven_splits_fail_clearly():
    out = torchrun(2, "pipeline_worker.py", "bad_split")
    _check_cases(out, ["bad_split"], 2)
    assert "8 layers do not split evenly into 3 pipeline stages" in out, out
    assert "Number of microbatches (1) must be greater than or equal to the number of stages (2)" in out, out
    # PyTorch splits a batch of 8 into microbatches of 3, 3, 2; the last stage's shapes were
    # inferred from the first microbatch, so its loss fails and the first stage times out.
    assert "Expected input batch_size (24) to match target batch_size (16)" in out, out


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4], ids=["2proc", "4proc"])
def test_expert_parallel_moe_matches_single_core(nproc):
    out = torchrun(nproc, "moe_worker.py", "grouped,loop,bad_experts")
    _check_cases(out, ["grouped", "loop", "bad_experts"], nproc)
    n = 3 if nproc == 2 else 6
    assert f"{n} experts cannot be split evenly over {nproc} expert-parallel ranks" in out, out
    assert "Split sizes doesn't match total dim 0 size" in out, out
