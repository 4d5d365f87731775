"""`torch-neuronx demo`: TRL SFT of a tiny Llama on `neuron`, checkpoint reloaded on CPU, generation, summary."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "torch_neuronx.cli", "demo"]


@pytest.mark.slow
def test_demo_fine_tunes_saves_reloads_on_cpu_and_generates(tmp_path):
    out_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_"))}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [
            *LAUNCH,
            "--steps",
            "8",
            "--max-new-tokens",
            "16",
            "--samples",
            "2",
            "--prompt",
            "A tensor",
            "--out",
            str(out_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = proc.stdout

    before = float(re.search(r"loss before:\s+([0-9.naif]+)", out).group(1))
    after = float(re.search(r"loss after:\s+([0-9.naif]+)", out).group(1))
    assert math.isfinite(before) and math.isfinite(after)
    assert before > 5.5  # a random model over a 512-token vocabulary: about ln(512) = 6.24
    assert after < before - 0.2, (before, after)

    generated = out.split("(sampled, temperature 0.7):")[1].split("-" * 60)[1].strip("\n").splitlines()
    assert len(generated) == 2 and all(g.startswith("A tensor") for g in generated), generated

    assert "device:           neuron:0 (trn2)" in out
    assert re.search(r"CPU reload:\s+max \|logits\(cpu\) - logits\(neuron\)\| = \S+ \(ok", out), out
    assert re.search(r"peak memory:\s+[1-9][0-9.]* MiB", out)
    assert re.search(r"tokens/s:\s+[0-9,]+ \(train\)", out)
    assert "'loss':" in out and "8/8" in proc.stderr  # the Trainer's loss logs and progress bar

    model_dir = out_dir / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (model_dir / name).is_file(), name
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["device"] == "neuron:0"
    assert summary["cpu_reload_max_logit_diff"] <= 1e-4
    assert summary["loss_after"] < summary["loss_before"]
    assert summary["train_curve"] and all(math.isfinite(v) for _, v in summary["train_curve"])
    assert (out_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_rejects_bad_arguments():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([*LAUNCH, "--steps", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--steps must be at least 1" in proc.stderr, proc.stderr[-2000:]


def test_imports_have_no_environment_side_effects():
    code = (
        "import os\n"
        "before = dict(os.environ)\n"
        "import torch_neuronx.demo, torch_neuronx.demo.hf, torch_neuronx.tools.arch_coverage\n"
        "changed = sorted(set(os.environ.items()) ^ set(before.items()))\n"
        "assert not changed, changed\n"
        "assert callable(torch_neuronx.demo.main) and callable(torch_neuronx.demo.hf.train_tokenizer)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_python_m_torch_neuronx_prints_the_cli_help():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "torch_neuronx"], env=env, capture_output=True, text=True, timeout=120)
    assert "usage: torch-neuronx" in proc.stdout and "demo" in proc.stdout, proc.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-m", "torch_neuronx", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "usage: torch-neuronx" in proc.stdout
