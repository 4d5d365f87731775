"""torchtitan's own trainer under ``torch-neuronx check --dry-run``: its Llama 3 debug model on 2
ranks, and the real Llama-3.1-8B flavour at its sequence length, 8 ranks, with only rank 0 run.

torchtitan reads a tokenizer and a small dataset from its repository (not its wheel); the tests
build stand-ins (a byte-level BPE tokenizer trained on the dataset, and a few hundred lines of
text), since the dry run computes no data: only the shapes of the batches matter.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import titan_assets, titan_release

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The two releases' command lines differ: 0.3 names a model by --module/--config, 0.2 by
# --model.name/--model.flavor (and 0.2's pipeline parallelism is the one PyTorch 2.13 runs).
# (Not installed, the module's own mark says so.)
_RELEASE = titan_release()
TITAN_03 = pytest.mark.skipif(bool(_RELEASE) and _RELEASE < (0, 3), reason="drives torchtitan 0.3's command line")
TITAN_02 = pytest.mark.skipif(bool(_RELEASE) and _RELEASE != (0, 2), reason="drives torchtitan 0.2's command line")

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed"),
    # every torchtitan model imports its expert-parallel kernels, which import triton
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton (torchtitan imports it) is not installed"
    ),
    pytest.mark.multiprocess,
]

# torchtitan 0.3.0 calls torch.distributed.set_timeout, which PyTorch 2.13 names _set_pg_timeout.
SHIM = """
import runpy

import torch.distributed as dist

if not hasattr(dist, "set_timeout"):
    dist.set_timeout = dist.distributed_c10d._set_pg_timeout
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
"""


def _check(tmp_path, check_args, titan_args, entry=("titan_torch213.py",)):
    """A dry run of torchtitan's trainer: `titan_args` are torchrun's two, then the trainer's;
    `entry` starts the trainer (0.3's through the bridge to PyTorch 2.13, 0.2's as its module)."""
    titan_assets(tmp_path)
    (tmp_path / "titan_torch213.py").write_text(textwrap.dedent(SHIM))
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--out", str(out), *check_args]
    cmd += ["--", "torchrun", *titan_args[:2], *entry, *titan_args[2:]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    env["HF_HUB_OFFLINE"] = "1"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return json.loads((out / "report.json").read_text()), p.stdout


COMMON = ["--parallelism.spmd_backend", "partial_dtensor", "--training.steps", "2"]


@TITAN_03
@pytest.mark.slow
def test_debug_model_fsdp_on_two_ranks(tmp_path):
    rep, stdout = _check(
        tmp_path,
        [],
        ["--nproc-per-node", "2", "--module", "llama3", "--config", "llama3_debugmodel", *COMMON]
        + ["--training.seq_len", "256", "--training.local_batch_size", "2"],
    )
    assert "Training completed" in stdout
    assert rep["steps"] == 2  # torchtitan's optimizer container steps its optimizer inside its own step
    assert sorted(m["rank"] for m in rep["memory_per_rank"]) == [0, 1]
    # FSDP2's all-gathers and reduce-scatters over the 2 ranks, and no rank waits for another
    kinds = {c["kind"] for c in rep["collectives"] if c["group_size"] == 2}
    assert {"allgather_base", "reduce_scatter_base"} <= kinds
    assert rep["across_ranks"]["findings"] == []
    assert rep["compile"]["graphs"]  # torchtitan compiles FlexAttention and its block mask with Inductor
    assert not rep["errors"]


@TITAN_03
@pytest.mark.slow
def test_llama3_8b_fsdp_over_eight_ranks_rank_0(tmp_path):
    # The real size: 8.0 B parameters, sequence 8192, FSDP over 8 ranks with full activation
    # checkpointing (with torchtitan's default selective checkpointing it does not fit 24 GiB).
    rep, _ = _check(
        tmp_path,
        ["--instance", "trn2.48xlarge", "--ranks", "0"],
        ["--nproc-per-node", "8", "--module", "llama3", "--config", "llama3_8b", *COMMON]
        + [
            "--hf-assets-path",
            "./tests/assets/tokenizer",
            "--dataloader.dataset",
            "c4_test",
            "activation-checkpoint:full",
        ],
    )
    assert (rep["world_size"], rep["ranks_run"], rep["steps"]) == (8, [0], 2)
    (mem,) = rep["memory"]
    gib = 1 << 30
    # fp32 parameters, gradients and AdamW's two states, each an eighth of 8.03 B
    assert (
        15.5 * gib
        < mem["breakdown"]["parameters"] + mem["breakdown"]["gradients"] + mem["breakdown"]["optimizer state"]
        < 17.5 * gib
    )
    assert 18 * gib < mem["peak_allocated"] < 24 * gib
    assert rep["verdict"].startswith("runs with") and "will not fit" not in rep["verdict"]
    (target,) = [e for e in rep["estimates"] if e["target"]]
    assert 0.2 < target["mfu"] < 1.0  # one step per torchtitan step: not halved by its optimizer container


@TITAN_02
@pytest.mark.slow
def test_pipeline_tensor_and_fsdp_on_eight_ranks_by_classes(tmp_path):
    """torchtitan 0.2's 1F1B over 2 stages with TP 2 and FSDP 2, started as torchrun -m (the
    package must not be imported before the ranks fork: it binds sys.argv on import)."""
    rep, _ = _check(
        tmp_path,
        ["--instance", "trn2.48xlarge"],
        ["--nproc-per-node", "8", "--model.name", "llama3", "--model.flavor", "debugmodel", "--training.steps", "2"]
        + ["--parallelism.tensor_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2"]
        + ["--parallelism.data_parallel_shard_degree", "2", "--parallelism.pipeline_parallel_microbatch_size", "1"]
        + ["--training.seq_len", "256", "--training.local_batch_size", "4"],
        entry=("-m", "torchtitan.train"),
    )
    assert rep["steps"] == 2 and not rep["errors"] and rep["across_ranks"]["findings"] == []
    assert sorted(m["rank"] for m in rep["memory_per_rank"]) == list(range(8))
    kinds = {c["kind"] for c in rep["collectives"]}
    # the stages' activations and gradients, FSDP's gathers and reductions, TP's all-reduces
    assert {"send", "recv", "allgather_base", "reduce_scatter_base", "all_reduce"} <= kinds, kinds
