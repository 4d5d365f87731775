"""examples/sft.py: TRL SFTTrainer on neuron. TP 2 x FSDP 2 through transformers'
DistributedConfig under torchrun (compiled, bf16, packed), and PEFT LoRA on one process; the
checkpoint written by ``trainer.save_model`` reloads on CPU with the trained model's logits."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, worker_env

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from torch_neuronx.demo.hf import build_base_checkpoint

    return build_base_checkpoint(str(tmp_path_factory.mktemp("sft") / "base"))


def _run(cmd, timeout):
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    return p


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sft_tp2_fsdp2_compiled_bf16_checkpoint_reloads_on_cpu(base_dir, tmp_path):
    p = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=4",
            str(WORKERS / "sft_worker.py"),
            "tp_fsdp",
            base_dir,
            str(tmp_path / "out"),
        ],
        timeout=900,
    )
    assert p.stdout.count("SFT tp_fsdp OK") == 1, p.stdout
    assert "'loss':" in p.stdout + p.stderr  # the Trainer's own loss logging


@pytest.mark.slow
def test_sft_lora_single_process_adapter_reloads_on_cpu(base_dir, tmp_path):
    p = _run([sys.executable, str(WORKERS / "sft_worker.py"), "lora", base_dir, str(tmp_path / "out")], timeout=300)
    assert "SFT lora OK" in p.stdout, p.stdout
    assert "4/4" in p.stderr  # the Trainer's progress bar reached the end


def test_sft_example_rejects_a_mesh_that_does_not_match_the_processes(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "sft.py"),
            "--tp_size",
            "2",
            "--fsdp_size",
            "2",
            "--output_dir",
            str(tmp_path / "out"),
            "--base_model_dir",
            str(tmp_path / "base"),
        ],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, (p.stdout + p.stderr)[-3000:]
    assert "must equal the number of processes (1)" in p.stderr and "torchrun" in p.stderr, p.stderr[-3000:]
    assert not (tmp_path / "base").exists()  # refused before building anything
