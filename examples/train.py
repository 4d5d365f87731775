"""Train a small character-level language model on ``neuron`` with data parallelism.

One script for every launcher: Hugging Face Accelerate picks the device, wraps the
model in DistributedDataParallel over the c10d backend ``neuron`` when there are
several processes, and applies ``--mixed_precision`` from its launcher.

    python examples/train.py                                    # one process, neuron:0
    torchrun --nproc_per_node=4 examples/train.py               # DDP, rank r on neuron:r
    accelerate launch --num_processes 1 --mixed_precision bf16 examples/train.py
    accelerate launch --multi_gpu --num_processes 2 --mixed_precision bf16 examples/train.py

The corpus is the one that ships with torch-neuronx (``--corpus FILE`` for your own).
Each rank trains on its own shard of the batches; at the end the script checks that
every rank holds the same weights (what DDP guarantees) and that the loss went down,
and exits non-zero otherwise. ``--out DIR`` saves the weights with ``torch.save``.
"""

import argparse
import math
import sys
from importlib import resources
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn


class CharLM(nn.Module):
    """A small causal Transformer over characters."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        mask = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        h = self.tok(idx) + self.pos(pos)
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per process and step (default 16)")
    p.add_argument("--context", type=int, default=64, help="characters per sequence (default 64)")
    p.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    p.add_argument("--layers", type=int, default=2, help="Transformer layers (default 2)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", type=Path, help="UTF-8 text file (default: the corpus shipped with torch-neuronx)")
    p.add_argument("--out", type=Path, help="directory to save the trained weights in (rank 0 writes)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "context", "dim", "layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def load_text(path):
    if path is None:
        return resources.files("torch_neuronx").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return path.read_text(encoding="utf-8")


def main(argv=None) -> int:
    args = parse_args(argv)
    acc = Accelerator()
    set_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)

    text = load_text(args.corpus)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    if len(data) <= args.context + 1:
        raise ValueError(
            f"the corpus has {len(data)} characters; --context {args.context} needs more than " f"{args.context + 1}"
        )

    model = CharLM(len(chars), args.dim, args.layers, heads=4 if args.dim % 4 == 0 else 1, context=args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
    )
    model, opt, sched = acc.prepare(model, opt, sched)

    # each rank draws different windows: a generator seeded by its rank
    gen = torch.Generator().manual_seed(args.seed * 1000 + acc.process_index)

    def batch():
        start = torch.randint(0, len(data) - args.context - 1, (args.batch_size,), generator=gen)
        x = torch.stack([data[s : s + args.context] for s in start.tolist()])
        y = torch.stack([data[s + 1 : s + 1 + args.context] for s in start.tolist()])
        return x.to(acc.device), y.to(acc.device)

    acc.print(
        f"train.py: {acc.num_processes} process(es) ({acc.distributed_type.value}), device {acc.device}, "
        f"mixed precision {acc.mixed_precision}, {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"vocabulary {len(chars)} characters"
    )
    losses = []
    model.train()
    for step in range(args.steps):
        x, y = batch()
        with acc.autocast():
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        # the mean over ranks: what the whole data-parallel batch saw
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
        if step % 10 == 0 or step == args.steps - 1:
            acc.print(f"step {step:4d}  loss {losses[-1]:.4f}")

    # DDP keeps replicas identical: compare every rank's weights with rank 0's
    flat = torch.cat([p.detach().float().flatten() for p in acc.unwrap_model(model).parameters()])
    ref = flat.clone()
    if acc.num_processes > 1:
        torch.distributed.broadcast(ref, src=0)
    in_sync = torch.equal(flat, ref)
    first = sum(losses[:5]) / len(losses[:5])
    last = sum(losses[-5:]) / len(losses[-5:])
    acc.print(
        f"loss {first:.4f} -> {last:.4f} (mean of the first and last 5 steps); "
        f"weights identical on all ranks: {in_sync}"
    )
    if args.out is not None:
        acc.wait_for_everyone()
        if acc.is_main_process:
            args.out.mkdir(parents=True, exist_ok=True)
            torch.save(acc.unwrap_model(model).state_dict(), args.out / "model.pt")
            acc.print(f"saved {args.out / 'model.pt'}")
    acc.end_training()
    if not in_sync:
        print(f"rank {acc.process_index}: weights differ from rank 0's", file=sys.stderr)
        return 1
    if args.steps >= 20 and not last < first:
        print(f"loss did not go down ({first:.4f} -> {last:.4f})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
