"""Pipeline parallelism on neuron (torch.distributed.pipelining), checked against a
single-core run of the same seeded model and data.

Usage (under torchrun): pipeline_worker.py CASE[,CASE...]
A case is SCHEDULE[:traced][:compile], e.g. GPipe, 1F1B:traced, Interleaved1F1B,
ZBVZeroBubble:compile (manual splits unless traced); GPipe:fsdp or 1F1B:fsdp (4 ranks: 2
stages x FSDP2 over 2 ranks); or "bad_split" (what an uneven split does).
Prints "CASE <case> OK <max grad diff>" per case on every rank.
"""

import copy
import datetime
import os
import resource
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as pp

DIM, HIDDEN, VOCAB, LAYERS = 32, 64, 64, 8
BATCH, SEQ, STEPS = 8, 8, 2
# Microbatching sums the gradients of the microbatches instead of computing the full
# batch at once: the same values up to float32 rounding of the sums.
RTOL, ATOL = 1e-5, 1e-6

# Schedules with one stage per rank; the others place two stages on each rank,
# in a loop (stage s on rank s % world) or in a V (rank r: stages r and 2 * world - 1 - r).
SINGLE = {"GPipe": pp.ScheduleGPipe, "1F1B": pp.Schedule1F1B}
LOOP = {
    "Interleaved1F1B": pp.ScheduleInterleaved1F1B,
    "LoopedBFS": pp.ScheduleLoopedBFS,
    "InterleavedZeroBubble": pp.ScheduleInterleavedZeroBubble,
}
V = {"ZBVZeroBubble": pp.ScheduleZBVZeroBubble, "DualPipeV": pp.ScheduleDualPipeV}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Embedding, LAYERS blocks, head; a stage keeps its own blocks and sets the rest to None
    (the torchtitan way of splitting a model by hand)."""

    def __init__(self, layers=LAYERS):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.emb(x) if self.emb is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.out(h) if self.out is not None else h


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def make_model():
    torch.manual_seed(0)
    return Net()


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, x.roll(-1, dims=1)


def split_manual(model, stage, num_stages):
    """Stage `stage` of `num_stages`: an equal share of the blocks, the embedding on the first
    stage, the final norm and the head on the last."""
    n = len(model.layers)
    if n % num_stages:
        raise ValueError(
            f"{n} layers do not split evenly into {num_stages} pipeline stages; "
            f"use a number of stages that divides {n}, or give the stages explicit layer ranges"
        )
    per = n // num_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    m = copy.deepcopy(model)
    for name in list(m.layers):
        if name not in keep:
            del m.layers[name]
    if stage > 0:
        m.emb = None
    if stage < num_stages - 1:
        m.norm = m.out = None
    return m


def stage_ids(name, rank, world):
    if name in SINGLE:
        return [rank], world
    if name in LOOP:
        return [rank, rank + world], 2 * world
    return [rank, 2 * world - 1 - rank], 2 * world


def reference(dev):
    """Losses and per-step gradients of the whole model on one core (full batch)."""
    model = make_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = (t.to(dev) for t in data())
    losses, grads = [], []
    for _ in range(STEPS):
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads


def run_case(case, rank, world, dev, ref_losses, ref_grads):
    name, *opts = case.split(":")
    traced, compiled = "traced" in opts, "compile" in opts
    schedule_cls = {**SINGLE, **LOOP, **V}[name]
    ids, num_stages = stage_ids(name, rank, world)
    n_micro = 2 * world
    x, y = data()
    model = make_model()
    if traced:
        assert name in SINGLE, "traced: one stage per rank"
        mb = x.chunk(n_micro)[0]
        per = LAYERS // num_stages
        split_spec = {f"layers.{s * per}": pp.SplitPoint.BEGINNING for s in range(1, num_stages)}
        pipe = pp.pipeline(model, mb_args=(mb,), split_spec=split_spec)
        assert pipe.num_stages == num_stages, pipe.num_stages
        stages = [pipe.build_stage(rank, dev)]
        mods = [stages[0].submod]
    else:
        mods = [split_manual(model, s, num_stages).to(dev) for s in ids]
        if compiled:
            # Zero-bubble schedules run the input and weight halves of the backward separately
            # (retain_graph=True), which AOTAutograd's donated buffers forbid.
            torch._functorch.config.donated_buffer = not ("ZeroBubble" in name or name == "DualPipeV")
            for m in mods:
                for block in m.layers.values():
                    block.compile(backend="neuron")
        stages = [pp.PipelineStage(m, s, num_stages, dev) for m, s in zip(mods, ids)]
    kw = {"n_microbatches": n_micro, "loss_fn": loss_fn}
    schedule = schedule_cls(stages[0], **kw) if name in SINGLE else schedule_cls(stages, **kw)
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    has_first, has_last = 0 in ids, num_stages - 1 in ids
    worst = 0.0
    for step in range(STEPS):
        losses = []
        args = (x.to(dev),) if has_first else ()
        kwargs = {"target": y.to(dev), "losses": losses} if has_last else {}
        schedule.step(*args, **kwargs)
        if has_last:
            assert len(losses) == n_micro, losses
            loss = torch.stack([t.detach() for t in losses]).mean().item()
            assert abs(loss - ref_losses[step]) <= ATOL + RTOL * abs(
                ref_losses[step]
            ), f"{case} step {step}: loss {loss} != single-core {ref_losses[step]}"
        checked = 0
        for m in mods:
            for k, p in m.named_parameters():
                k = k.replace("_orig_mod.", "")
                ref = ref_grads[step][k]
                assert p.grad is not None, f"{case}: no gradient for {k}"
                diff = (p.grad.cpu() - ref.cpu()).abs().max().item()
                worst = max(worst, diff)
                torch.testing.assert_close(p.grad.cpu(), ref.cpu(), rtol=RTOL, atol=ATOL, msg=f"{case} step {step} {k}")
                checked += 1
        assert checked, f"{case}: stage without parameters"
        opt.step()
        opt.zero_grad()
    return worst


def run_pp_fsdp(name, rank, world, dev, ref_losses, ref_grads):
    """A 2-D mesh (as torchtitan builds it): 2 pipeline stages, each sharded with FSDP2 over
    2 data-parallel ranks that take half of the batch each."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    assert world == 4, "pp_fsdp needs 4 processes"
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "pp"))
    dp, pp_mesh = mesh["dp"], mesh["pp"]
    stage_idx, num_stages = pp_mesh.get_local_rank(), 2
    mod = split_manual(make_model(), stage_idx, num_stages).to(dev)
    for block in mod.layers.values():
        fully_shard(block, mesh=dp)
    fully_shard(mod, mesh=dp)
    stage = pp.PipelineStage(mod, stage_idx, num_stages, dev, group=pp_mesh.get_group())
    n_micro = 2
    schedule = SINGLE[name](stage, n_microbatches=n_micro, loss_fn=loss_fn)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x, y = data()
    per = BATCH // dp.size()
    mine = slice(dp.get_local_rank() * per, (dp.get_local_rank() + 1) * per)
    worst = 0.0
    for step in range(STEPS):
        losses = []
        if stage_idx == 0:
            schedule.step(x[mine].to(dev))
        else:
            schedule.step(target=y[mine].to(dev), losses=losses)
            loss = torch.stack([t.detach() for t in losses]).mean()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=dp.get_group())
            assert abs(loss.item() - ref_losses[step]) <= ATOL + RTOL * abs(
                ref_losses[step]
            ), f"pp_fsdp step {step}: loss {loss.item()} != single-core {ref_losses[step]}"
        for k, p in mod.named_parameters():
            g = p.grad.full_tensor()
            ref = ref_grads[step][k]
            worst = max(worst, (g - ref).abs().max().item())
            torch.testing.assert_close(g.cpu(), ref.cpu(), rtol=RTOL, atol=ATOL, msg=f"pp_fsdp step {step} {k}")
        opt.step()
        opt.zero_grad()
    return worst


def bad_split(rank, world, dev):
    """What uneven splits do: layers that do not divide into the stages (this file's split
    raises), fewer microbatches than stages (PyTorch raises), and a batch that does not divide
    into the microbatches (PyTorch splits it unevenly and the last stage fails)."""
    msgs = []
    try:
        split_manual(make_model(), 0, 3)
    except ValueError as e:
        msgs.append(f"layers: ValueError: {e}")
    assert "do not split evenly into 3 pipeline stages" in msgs[-1], msgs
    mod = split_manual(make_model(), rank, world).to(dev)
    stage = pp.PipelineStage(mod, rank, world, dev)
    try:
        pp.Schedule1F1B(stage, n_microbatches=world - 1, loss_fn=loss_fn)
    except ValueError as e:
        msgs.append(f"microbatches: ValueError: {e}")
    assert "must be greater than or equal to the number of stages" in msgs[-1], msgs
    # A short timeout: the stages that wait for the failed last stage give up quickly.
    group = dist.new_group(timeout=datetime.timedelta(seconds=10))
    stage = pp.PipelineStage(split_manual(make_model(), rank, world).to(dev), rank, world, dev, group=group)
    sched = pp.ScheduleGPipe(stage, n_microbatches=3, loss_fn=loss_fn)
    x, y = data()
    try:
        if rank == 0:
            sched.step(x.to(dev))
        elif rank == world - 1:
            sched.step(target=y.to(dev), losses=[])
        else:
            sched.step()
    except Exception as e:  # noqa: BLE001
        msgs.append(f"batch: {type(e).__name__}: {e}".splitlines()[0])
    else:
        msgs.append("batch: accepted")
    if rank == world - 1:
        assert "Expected input batch_size" in msgs[-1], msgs
    else:
        assert "imed out" in msgs[-1] or "Connection" in msgs[-1], msgs
    for m in msgs:
        print(f"rank {rank}: BAD_SPLIT_MESSAGE {m}", flush=True)


def main():
    cases = sys.argv[1].split(",")
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    ref_losses, ref_grads = reference(dev)
    for case in cases:
        if case == "bad_split":
            bad_split(rank, world, dev)
            print(f"rank {rank}: CASE bad_split OK", flush=True)
            continue
        if case.endswith(":fsdp"):
            worst = run_pp_fsdp(case.split(":")[0], rank, world, dev, ref_losses, ref_grads)
        else:
            worst = run_case(case, rank, world, dev, ref_losses, ref_grads)
        dist.barrier()
        print(f"rank {rank}: CASE {case} OK {worst:.2e}", flush=True)
    dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rank {rank}: PEAK_RSS_MIB {peak:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
