"""torchtitan 0.2.2's own trainer, run for real on neuron: its pipeline layouts (1F1B with tensor
parallelism and FSDP2, interleaved 1F1B with FSDP2) train its Llama 3 debug model to the losses of
the same model, weights and data on one core.

CPU cannot be the reference: torchtitan picks an accelerator and has no CPU path. Three things
make the layouts comparable with one core, all through torchtitan's own options:

* the same initial weights: torchtitan's seed checkpoint, made on one rank and loaded by every
  run (a pipeline stage initialises only its own layers, drawing other random numbers);
* the same text on every data-parallel rank: torchtitan gives each one a contiguous share of the
  dataset, and the dataset here is the same lines once per rank;
* float32 parameters under FSDP2 (its default is bfloat16; one core has no FSDP and trains in float32).
"""

import importlib.util
import re
import subprocess
import sys

import pytest

from helpers import titan_assets, titan_release, worker_env

pytestmark = [
    pytest.mark.skipif(titan_release() != (0, 2), reason="needs torchtitan 0.2 (the release PyTorch 2.13 pipelines)"),
    # every torchtitan model imports its expert-parallel kernels, which import triton
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton (torchtitan imports it) is not installed"
    ),
    pytest.mark.multiprocess,
    pytest.mark.slow,
]

STEPS = 3
TRAIN = ["--model.name", "llama3", "--model.flavor", "debugmodel", "--training.seq_len", "256"]
TRAIN += ["--training.local_batch_size", "4", "--training.steps", str(STEPS), "--metrics.log_freq", "1"]
TRAIN += ["--training.mixed_precision_param", "float32"]
TOKENS_PER_RANK = 4 * 256
DP = 2
# Only the last pipeline stage prints the loss; the others print minus the number of their
# data-parallel ranks.
STEP = re.compile(r"step:\s+(\d+)\s+\S*loss:\s+([\d.]+)\s+\S*grad_norm:\s+([\d.]+)")
# The log prints losses to 5 decimals. Gradient norms: torchtitan computes a float32 norm of each
# gradient (or shard) and combines them; CPU's own float32 norm of the debug model's gradients is
# 1.7e-4 off their float64 norm, and sharded the rounding differs.
LOSS_ATOL, NORM_RTOL = 2e-5, 5e-4


def _torchrun(workdir, nproc, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "torchtitan.train", *args]
    env = worker_env(TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge")  # 8 ranks need 8 cores; the default has 4
    p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"torchtitan on {nproc} ranks failed (rc {p.returncode}):\n{out[-6000:]}"
    return out


def _train(workdir, nproc, *layout):
    """(loss, grad norm) per step, as the last stage logged them."""
    out = _torchrun(
        workdir,
        nproc,
        *TRAIN,
        *layout,
        "--checkpoint.enable",
        "--checkpoint.load_only",
        "--checkpoint.initial_load_path",
        "seed/checkpoint/step-0",
        "--job.dump_folder",
        f"run{nproc}",
    )
    steps = {int(s): (float(loss), float(norm)) for s, loss, norm in STEP.findall(re.sub(r"\x1b\[[\d;]*m", "", out))}
    assert sorted(steps) == list(range(1, STEPS + 1)), out[-4000:]
    return [steps[s] for s in sorted(steps)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("titan")
    titan_assets(root, copies=DP)
    _torchrun(
        root, 1, *TRAIN, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", "--job.dump_folder", "seed"
    )
    return root


@pytest.fixture(scope="module")
def one_core(workdir):
    return _train(workdir, 1)


PP = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_microbatch_size", "1"]
FSDP = ["--parallelism.data_parallel_shard_degree", str(DP)]


@pytest.mark.parametrize(
    "nproc, layout",
    [
        (8, [*PP, *FSDP, "--parallelism.tensor_parallel_degree", "2"]),
        (4, [*PP, *FSDP, "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"]),
    ],
    ids=["tp2-pp2-fsdp2-1f1b", "pp2-fsdp2-interleaved-1f1b"],
)
def test_pipeline_layouts_train_to_the_losses_of_one_core(workdir, one_core, nproc, layout):
    steps = _train(workdir, nproc, *layout)
    for (loss, norm), (ref_loss, ref_norm) in zip(steps, one_core):
        assert loss == pytest.approx(ref_loss, abs=LOSS_ATOL), (steps, one_core)
        # torchtitan 0.2.2's pipeline schedule runs the backward of the loss summed over the
        # batch's tokens (its loss has reduction="sum", its schedule scale_grads=False): the
        # gradients, and so their norm, are the one-core ones times the global batch's tokens.
        # AdamW's update does not depend on that scale, so the losses agree.
        assert norm == pytest.approx(ref_norm * TOKENS_PER_RANK * DP, rel=NORM_RTOL), (steps, one_core)
