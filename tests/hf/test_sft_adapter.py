"""examples/sft.py --use_peft: the saved adapter names its base model by an absolute path, so it
reloads from any working directory (a relative base made it load only from the training one)."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from helpers import REPO, worker_env


def test_lora_adapter_reloads_from_another_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cmd = [
        sys.executable,
        str(REPO / "examples" / "sft.py"),
        "--output_dir",
        "out",
        "--base_model_dir",
        "base",
        "--max_steps",
        "1",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--disable_tqdm",
        "true",
    ]
    p = subprocess.run(cmd, cwd=work, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]

    config = json.loads((work / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(work / "base"), config["base_model_name_or_path"]

    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    assert os.getcwd() != str(work)
    model = AutoPeftModelForCausalLM.from_pretrained(str(work / "out"))
    base = AutoModelForCausalLM.from_pretrained(str(work / "base"))
    saved = load_file(str(work / "out" / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    for name, value in saved.items():
        loaded = params[name.replace(".weight", ".default.weight")]
        torch.testing.assert_close(loaded.detach(), value, rtol=0, atol=0)
    torch.testing.assert_close(
        params["base_model.model.model.embed_tokens.weight"].detach(),
        base.model.embed_tokens.weight.detach(),
        rtol=0,
        atol=0,
    )
