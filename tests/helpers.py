"""Shared test helpers."""

import os
import subprocess
import sys
from pathlib import Path

from torch import nn

REPO = Path(__file__).resolve().parents[1]


def worker_env(**extra: str) -> dict:
    """Environment for worker processes: they import this tree's torch_neuronx and examples."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def run_python(code: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (device configuration is read at start-up)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout)


class MLP(nn.Module):
    """The small MLP the parity tests train and compile."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, 64),
            nn.GELU(),
            nn.LayerNorm(64),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x):
        return self.net(x)


def tiny_llama(**config):
    """A 2-layer Llama (GQA, vocab 1000) with seeded weights, in eval mode, on CPU; `config`
    overrides LlamaConfig fields."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **{
            "vocab_size": 1000,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "bos_token_id": 0,
            "eos_token_id": 999,
            "pad_token_id": 999,
            **config,
        }
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def load_example(name: str):
    """examples/<name>.py as a module (the examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_example", REPO / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def full_logits(model, ids):
    """The model's logits for ids, in eval mode, gathered from a DTensor if sharded, fp32 on CPU."""
    import torch
    from torch.distributed.tensor import DTensor

    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids).logits
    return (out.full_tensor() if isinstance(out, DTensor) else out).float().cpu()
