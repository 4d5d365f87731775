"""Train a tiny Llama-style language model on the ``neuron`` device, then let it write.

The demo builds a character-level tokenizer from a small English corpus that
ships with the package (``torch_neuronx/data/corpus.txt``), trains a two-layer
``LlamaForCausalLM`` from scratch with AdamW (optionally under bf16 autocast),
generates text greedily with ``model.generate`` and prints a summary. Nothing is
downloaded: the model is built from a config and the tokenizer from the corpus.

Run it with ``torch-neuronx demo`` or ``python -m torch_neuronx.demo``::

    torch-neuronx demo --steps 300 --out runs/demo
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from importlib import resources

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

DEFAULT_PROMPT = "The model "


def load_corpus(path: str | None = None) -> str:
    """The demo corpus (package data) or a text file given by the user."""
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read()
    return resources.files("torch_neuronx").joinpath("data/corpus.txt").read_text(encoding="utf-8")


class CharTokenizer:
    """A character-level tokenizer built from a text: one id per distinct character.

    Id 0 is ``<pad>``, 1 is ``<bos>``, 2 is ``<eos>``; characters outside the
    vocabulary map to ``<unk>`` (3).
    """

    SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
    pad_token_id, bos_token_id, eos_token_id, unk_token_id = 0, 1, 2, 3

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.itos = self.SPECIALS + self.chars
        self.stoi = {c: i for i, c in enumerate(self.itos) if i >= len(self.SPECIALS)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.unk_token_id) for c in text]

    def decode(self, ids) -> str:
        n = len(self.SPECIALS)
        return "".join(self.itos[i] for i in ids if i >= n)

    def save(self, directory: str) -> None:
        with open(os.path.join(directory, "char_tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump({"type": "char", "specials": self.SPECIALS, "chars": self.chars}, f, indent=1)

    @classmethod
    def load(cls, directory: str) -> "CharTokenizer":
        with open(os.path.join(directory, "char_tokenizer.json"), encoding="utf-8") as f:
            return cls(json.load(f)["chars"])


def build_model(vocab_size: int, args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.hidden_size * 2 + args.hidden_size * 2 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=max(512, args.seq_len + args.max_new_tokens + 64),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=CharTokenizer.pad_token_id,
        bos_token_id=CharTokenizer.bos_token_id,
        eos_token_id=CharTokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torch-neuronx demo",
        description="Train a tiny Llama-style character-level LM on the neuron device "
        "(NeuronCore simulator), then generate text with it.",
    )
    p.add_argument("--steps", type=int, default=150, help="training steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=128, help="characters per sequence (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run forward/backward under torch.autocast(device, dtype=torch.bfloat16)",
    )
    p.add_argument("--device", default="neuron", help="torch device (default: %(default)s; 'cpu' to compare)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt for generation (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="characters to generate (default: %(default)s)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=0,
                   help="forbid repeating any character n-gram of this size while generating (0: off)")
    p.add_argument("--corpus", default=None, help="train on this UTF-8 text file instead of the built-in corpus")
    p.add_argument("--eval-every", type=int, default=None,
                   help="held-out loss every N steps (default: about ten times per run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="save the model (save_pretrained), tokenizer, losses and loss.png here")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = p.parse_args(argv)
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 10)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.hidden_size % args.heads:
        p.error("--hidden-size must be divisible by --heads")
    return args


def save_loss_plot(losses: list[float], val_losses: list[tuple[int, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.8, alpha=0.45, label="training loss per step")
    if len(losses) >= 5:
        ema, smooth = losses[0], []
        for v in losses:
            ema = 0.9 * ema + 0.1 * v
            smooth.append(ema)
        ax.plot(steps, smooth, lw=1.8, label="training loss (moving average)")
    if val_losses:
        ax.plot([s for s, _ in val_losses], [v for _, v in val_losses], "o-", ms=4, lw=1.5,
                label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch
    from tqdm import tqdm

    import torch_neuronx

    device = torch.device(args.device)
    on_neuron = device.type == "neuron"
    if on_neuron and device.index is None:
        device = torch.device("neuron", torch.neuron.current_device())

    torch.manual_seed(args.seed)
    text = load_corpus(args.corpus)
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    if len(data) < 2 * (args.seq_len + 1):
        print(f"error: corpus too short for --seq-len {args.seq_len}", file=sys.stderr)
        return 2
    n_val = max(args.seq_len + 1, len(data) // 10)
    train, val = data[:-n_val], data[-n_val:]
    gen = torch.Generator().manual_seed(args.seed)

    def batch(source: torch.Tensor, size: int) -> torch.Tensor:
        starts = torch.randint(0, len(source) - args.seq_len, (size,), generator=gen)
        return torch.stack([source[s : s + args.seq_len] for s in starts.tolist()]).to(device)

    val_batch = batch(val, 8)

    model = build_model(tok.vocab_size, args).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    warmup = max(1, min(20, args.steps // 10))

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    @torch.no_grad()
    def eval_loss() -> float:
        model.eval()
        with autocast:
            loss = model(input_ids=val_batch, labels=val_batch).loss
        model.train()
        return loss.item()

    dev_name = torch.neuron.get_device_name(device) if on_neuron else str(device)
    print(
        f"torch-neuronx demo: Llama-style LM, {args.layers} layers, hidden {args.hidden_size}, "
        f"{args.heads} heads, {n_params / 1e6:.2f}M parameters"
    )
    print(
        f"device: {device} ({dev_name}, simulated)" if on_neuron else f"device: {device}",
        f"| corpus: {len(text)} chars, vocab {tok.vocab_size} | bf16 autocast: {'on' if args.bf16 else 'off'}",
    )
    if on_neuron:
        torch.neuron.reset_peak_memory_stats(device)

    loss_before = eval_loss()
    losses: list[float] = []
    val_losses: list[tuple[int, float]] = [(0, loss_before)]
    model.train()
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="training", unit="step", disable=args.no_progress, dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = batch(train, args.batch_size)
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            t_eval = time.perf_counter()
            val_losses.append((step + 1, eval_loss()))
            t0 += time.perf_counter() - t_eval  # tokens/s counts training only
        bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{val_losses[-1][1]:.3f}")
    bar.close()
    if on_neuron:
        torch.neuron.synchronize(device)
    train_time = time.perf_counter() - t0
    loss_after = val_losses[-1][1]

    # Greedy generation on the device.
    model.eval()
    prompt_ids = [tok.bos_token_id] + tok.encode(args.prompt)
    input_ids = torch.tensor([prompt_ids], device=device)
    t1 = time.perf_counter()
    with torch.no_grad(), autocast:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            no_repeat_ngram_size=args.no_repeat_ngram_size,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    gen_time = time.perf_counter() - t1
    new_ids = out[0, len(prompt_ids):].tolist()
    completion = tok.decode(new_ids)

    print()
    print("generated text (greedy):")
    print("-" * 60)
    print(args.prompt + completion)
    print("-" * 60)

    tokens = args.steps * args.batch_size * args.seq_len
    summary = {
        "device": str(device),
        "device_name": dev_name,
        "steps": args.steps,
        "tokens_trained": tokens,
        "train_seconds": round(train_time, 2),
        "tokens_per_second": round(tokens / train_time, 1),
        "loss_before": round(loss_before, 4),
        "loss_after": round(loss_after, 4),
        "train_loss_first": round(losses[0], 4),
        "train_loss_last": round(losses[-1], 4),
        "generated_tokens": len(new_ids),
        "generate_tokens_per_second": round(len(new_ids) / gen_time, 1) if gen_time > 0 else None,
        "bf16": args.bf16,
    }
    if on_neuron:
        summary["peak_memory_bytes"] = torch.neuron.max_memory_allocated(device)
        summary["cpu_fallback_ops"] = sorted(torch_neuronx.get_fallback_ops())

    print("summary:")
    print(f"  device:           {device} ({dev_name})")
    print(f"  steps:            {args.steps} ({tokens} tokens in {train_time:.1f} s)")
    print(f"  tokens/s:         {tokens / train_time:,.0f} (train), "
          f"{summary['generate_tokens_per_second']} (generate)")
    best_step, best_val = min(val_losses, key=lambda sv: sv[1])
    print(f"  loss before:      {loss_before:.4f} (held-out), {losses[0]:.4f} (first training batch)")
    print(f"  loss after:       {loss_after:.4f} (held-out; best {best_val:.4f} at step {best_step}), "
          f"{losses[-1]:.4f} (last training batch)")
    if on_neuron:
        print(f"  peak memory:      {summary['peak_memory_bytes'] / 2**20:.1f} MiB "
              "(torch.neuron.max_memory_allocated)")
        fb = summary["cpu_fallback_ops"]
        print(f"  CPU-fallback ops: {len(fb)}" + (f" ({', '.join(fb)})" if fb else ""))

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        model.save_pretrained(args.out)
        tok.save(args.out)
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(dict(summary, losses=losses, val_losses=val_losses, generated=args.prompt + completion),
                      f, indent=1)
        plot = os.path.join(args.out, "loss.png")
        save_loss_plot(losses, val_losses, plot, f"tiny Llama on {device} ({dev_name})")
        print(f"  saved:            model + tokenizer + summary.json + loss.png in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
