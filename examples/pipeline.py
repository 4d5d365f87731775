"""Pipeline parallelism on ``neuron`` with torch.distributed.pipelining.

A stack of residual MLP blocks is split by hand into one stage per rank (or two, for the
looped and V-shaped schedules), trained for a few steps with a PyTorch schedule, and
compared with the same seeded model trained on one core: the script exits non-zero if a
loss differs by more than 1e-5 (relative).

    torchrun --nproc_per_node=2 examples/pipeline.py                       # GPipe
    torchrun --nproc_per_node=4 examples/pipeline.py --schedule Interleaved1F1B
    torchrun --nproc_per_node=2 examples/pipeline.py --schedule ZBVZeroBubble --compile
"""

import argparse
import copy
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining as pp

SINGLE = {"GPipe": pp.ScheduleGPipe, "1F1B": pp.Schedule1F1B}
LOOPED = {
    "Interleaved1F1B": pp.ScheduleInterleaved1F1B,
    "LoopedBFS": pp.ScheduleLoopedBFS,
    "InterleavedZeroBubble": pp.ScheduleInterleavedZeroBubble,
}
V_SHAPED = {"ZBVZeroBubble": pp.ScheduleZBVZeroBubble, "DualPipeV": pp.ScheduleDualPipeV}


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim) for i in range(layers)})
        self.norm, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.emb(x) if self.emb is not None else x
        for layer in self.layers.values():
            h = layer(h)
        return self.out(self.norm(h)) if self.out is not None else h


def stage_module(model, stage, num_stages):
    """The blocks of `stage`; the embedding on the first stage, norm and head on the last."""
    n = len(model.layers)
    if n % num_stages:
        raise ValueError(f"{n} layers do not split evenly into {num_stages} pipeline stages; use --layers a multiple")
    per = n // num_stages
    m = copy.deepcopy(model)
    for name in list(m.layers):
        if not stage * per <= int(name) < (stage + 1) * per:
            del m.layers[name]
    if stage > 0:
        m.emb = None
    if stage < num_stages - 1:
        m.norm = m.out = None
    return m


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--schedule", default="GPipe", choices=[*SINGLE, *LOOPED, *V_SHAPED])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--compile", action="store_true", help='torch.compile(backend="neuron") every block')
    args = p.parse_args()

    dist.init_process_group("neuron")  # rank r runs on neuron:r
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    vocab, seq = 128, 16
    torch.manual_seed(0)
    model = Net(vocab, args.dim, args.layers)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (args.batch_size, seq), generator=g)
    y = x.roll(-1, dims=1)

    # The reference: the whole model on this rank's core.
    ref = copy.deepcopy(model).to(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for _ in range(args.steps):
        loss = loss_fn(ref(x.to(dev)), y.to(dev))
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(loss.item())

    if args.schedule in SINGLE:
        ids, num_stages = [rank], world
    elif args.schedule in LOOPED:
        ids, num_stages = [rank, rank + world], 2 * world
    else:
        ids, num_stages = [rank, 2 * world - 1 - rank], 2 * world
    mods = [stage_module(model, s, num_stages).to(dev) for s in ids]
    if args.compile:
        if "ZeroBubble" in args.schedule or args.schedule == "DualPipeV":
            # These schedules run the input and weight halves of the backward separately
            # (retain_graph=True), which AOTAutograd's donated buffers forbid.
            torch._functorch.config.donated_buffer = False
        for m in mods:
            for block in m.layers.values():
                block.compile(backend="neuron")
    stages = [pp.PipelineStage(m, s, num_stages, dev) for m, s in zip(mods, ids)]
    cls = {**SINGLE, **LOOPED, **V_SHAPED}[args.schedule]
    n_micro = 2 * world
    schedule = cls(stages[0] if args.schedule in SINGLE else stages, n_microbatches=n_micro, loss_fn=loss_fn)
    opt = torch.optim.SGD([q for m in mods for q in m.parameters()], lr=0.1)

    start = time.perf_counter()
    worst = torch.zeros((), device=dev)
    for step in range(args.steps):
        losses = []
        inputs = (x.to(dev),) if 0 in ids else ()
        kw = {"target": y.to(dev), "losses": losses} if num_stages - 1 in ids else {}
        schedule.step(*inputs, **kw)
        opt.step()
        opt.zero_grad()
        if losses:
            loss = torch.stack(losses).mean()
            worst = torch.maximum(worst, (loss - ref_losses[step]).abs() / abs(ref_losses[step]))
            print(f"step {step}: loss {loss.item():.5f} (one core: {ref_losses[step]:.5f})", flush=True)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(
            f"{args.schedule} on {world} ranks, {num_stages} stages: {time.perf_counter() - start:.1f} s, "
            f"largest relative loss difference vs one core {worst.item():.1e}"
        )
    dist.destroy_process_group()
    if worst.item() > 1e-5:
        raise SystemExit("pipeline losses differ from the single-core run")


if __name__ == "__main__":
    main()
