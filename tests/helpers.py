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


def titan_assets(root: Path, copies: int = 1) -> None:
    """The tokenizer and dataset torchtitan reads from its repository (tests/assets/tokenizer and
    tests/assets/c4_test under `root`): a byte-level BPE trained on a few hundred lines of text,
    and those lines `copies` times over (torchtitan gives each data-parallel rank a contiguous
    share of the lines, so with as many copies as ranks every rank reads the same text)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    words = "the model trains on neuron with fully sharded data parallel and tensor parallel layouts".split()
    lines = [" ".join(words[(i + j) % len(words)] for j in range(40)) for i in range(200)]
    data = root / "tests" / "assets" / "c4_test"
    data.mkdir(parents=True)
    (data / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines) * copies)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    tdir = root / "tests" / "assets" / "tokenizer"
    tdir.mkdir(parents=True)
    tok.save(str(tdir / "tokenizer.json"))
    config = {"bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[2]}
    (tdir / "tokenizer_config.json").write_text(json.dumps(config))


def titan_release() -> tuple:
    """torchtitan's installed (major, minor) release, or () when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("torchtitan").split(".")[:2])
    except PackageNotFoundError:
        return ()
