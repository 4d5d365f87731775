"""The `torch-neuronx demo`: trains a tiny Llama on `neuron`, generates, saves."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

LAUNCH = [sys.executable, "-m", "torch_neuronx.demo"]


@pytest.mark.slow
def test_demo_runs_and_learns(tmp_path):
    out_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_"))}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [*LAUNCH, "--steps", "5", "--max-new-tokens", "40", "--prompt", "The river ", "--out", str(out_dir)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout

    before = float(re.search(r"loss before:\s+([0-9.naif]+)", out).group(1))
    after = float(re.search(r"loss after:\s+([0-9.naif]+)", out).group(1))
    assert math.isfinite(before) and math.isfinite(after)
    assert after < before

    assert "generated text (greedy):" in out
    generated = out.split("generated text (greedy):")[1].split("-" * 60)[1].strip("\n")
    assert generated.startswith("The river ")
    assert len(generated) > len("The river ")

    assert "device:           neuron:0 (trn2)" in out
    assert re.search(r"peak memory:\s+[1-9][0-9.]* MiB", out)
    assert re.search(r"tokens/s:\s+[0-9,]+", out)
    assert "training" in proc.stderr  # tqdm progress bar

    for name in ("config.json", "model.safetensors", "char_tokenizer.json", "summary.json", "loss.png"):
        assert (out_dir / name).is_file(), name
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["steps"] == 5 and len(summary["losses"]) == 5
    assert all(math.isfinite(v) for v in summary["losses"])
    assert summary["device"] == "neuron:0"
    assert (out_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
