"""Hugging Face building blocks of the demo, for examples and tests too: the shipped corpus as a
``datasets.Dataset``, a byte-level BPE tokenizer trained locally with ``tokenizers`` and
wrapped as a ``PreTrainedTokenizerFast``, and a tiny Llama-style checkpoint built from a
config. Nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import resources

__all__ = [
    "SPECIAL_TOKENS",
    "build_base_checkpoint",
    "corpus_dataset",
    "load_corpus",
    "tiny_llama_config",
    "train_tokenizer",
]

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def load_corpus(path: str | None = None) -> str:
    """The demo corpus (package data ``torch_neuronx/data/corpus.txt``) or a UTF-8 text file."""
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read()
    return resources.files("torch_neuronx").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def corpus_dataset(text: str | None = None, unit: str = "paragraph"):
    """A ``datasets.Dataset`` with one ``text`` row per paragraph (or sentence) of the corpus."""
    import re

    from datasets import Dataset

    if unit not in ("paragraph", "sentence"):
        raise ValueError(f"unit must be 'paragraph' or 'sentence', got {unit!r}")
    text = load_corpus() if text is None else text
    rows = [p.strip() for p in text.split("\n\n") if p.strip()]
    if unit == "sentence":
        rows = [s for p in rows for s in re.split(r"(?<=[.!?])\s+", " ".join(p.split())) if s]
    if not rows:
        raise ValueError("the corpus has no non-empty paragraph")
    return Dataset.from_dict({"text": rows})


def train_tokenizer(text: str | None = None, vocab_size: int = 512):
    """Train a byte-level BPE on ``text`` (default: the corpus) and wrap it for transformers.

    Byte-level, so any input encodes and ``decode(encode(s)) == s``; pad/bos/eos/unk are
    ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}"
        )
    text = load_corpus() if text is None else text
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([p for p in text.split("\n") if p.strip()], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_max_length=4096,
    )


def tiny_llama_config(
    tokenizer,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    max_positions: int = 1024,
):
    """A small ``LlamaConfig`` sized for ``tokenizer``; heads stay divisible by 2 for tensor parallelism."""
    from transformers import LlamaConfig

    if hidden_size % heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by heads ({heads})")
    # the embedding rows are padded to a multiple of 64 so tensor parallelism can split them
    vocab = -(-len(tokenizer) // 64) * 64
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 8 // 3 // 16 * 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_base_checkpoint(path: str, seed: int = 0, vocab_size: int = 512, **config_kwargs) -> str:
    """Write a randomly initialised tiny Llama and its tokenizer to ``path`` (a standard
    ``save_pretrained`` directory) unless it already exists; returns ``path``.

    Safe to call from every rank of a torchrun job at once: each process builds the same
    deterministic checkpoint in a private directory and renames it into place; the first
    rename wins.
    """
    import torch
    from transformers import LlamaForCausalLM

    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".base-", dir=parent)
    try:
        tokenizer = train_tokenizer(vocab_size=vocab_size)
        cpu_rng = torch.random.get_rng_state()
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_llama_config(tokenizer, **config_kwargs))
        torch.random.set_rng_state(cpu_rng)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
