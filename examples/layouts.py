"""Combined parallel layouts on ``neuron``, with dropout on sharded activations.

Two layouts of torchtitan's kind, each trained for two steps and compared with the same seeded
model and data on one core (the losses and every parameter's gradient, within rtol 1e-5 and
atol 1e-6; the script exits non-zero otherwise):

* ``--layout pp_dp_tp --mesh PxDxT``: a (pp, dp, tp) mesh of P*D*T ranks (tp innermost): the
  model split into P pipeline stages (1F1B), each stage sharded with FSDP2 over dp and
  tensor/sequence parallel over tp (torchtitan's Llama plan: activations sharded on the
  sequence between the blocks and between the stages);
* ``--layout cp_tp --mesh CxT``: a (cp, tp) mesh: causal attention blocks under
  ``context_parallel`` (ring attention over cp, head-tail load balancing), tensor/sequence
  parallel over tp, FSDP2 over cp (torchtitan's dp_shard_cp).

Every block ends with dropout on its sequence-sharded DTensor output: DTensor's RNG tracker
gives each tp shard its own offset of the neuron generator. Each rank records the masks it
drew and the single-core reference replays them, so both runs drop the same elements.

    TORCH_NEURONX_INSTANCE_TYPE=trn2.48xlarge torchrun --nproc_per_node=8 examples/layouts.py --layout pp_dp_tp --mesh 2x2x2
    torchrun --nproc_per_node=4 examples/layouts.py --layout cp_tp --mesh 2x2
"""

import argparse
import datetime
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pipeline import Block, Net, loss_fn, stage_module  # examples/pipeline.py
from torch import nn
from torch.distributed import pipelining as pp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._random import manual_seed as dtensor_manual_seed
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

VOCAB, DIM, LAYERS, BATCH, SEQ, HEAD_DIM, STEPS, P = 64, 32, 4, 8, 16, 8, 2, 0.25
# Tensor parallelism splits the matmuls' sums over ranks and FSDP averages gradients with a
# reduce-scatter: the same values up to float32 rounding of the sums.
RTOL, ATOL = 1e-5, 1e-6


class _Dropout(nn.Module):
    """F.dropout that records the mask of every call (its local shard, as drawn on this rank),
    or, given `replay` masks (full tensors), multiplies by them instead (the reference)."""

    def __init__(self):
        super().__init__()
        self.drawn, self.replay = [], None

    def forward(self, h):
        if self.replay is not None:
            return h * self.replay.pop(0) / (1 - P)
        out = F.dropout(h, P, training=True)
        local_in, local_out = (t.to_local() if isinstance(t, DTensor) else t for t in (h, out))
        mask = local_out != 0
        # Activations are never exactly 0 here, so the zeros are the dropped elements.
        torch.testing.assert_close(local_out[mask], local_in[mask] / (1 - P))
        self.drawn.append(mask.cpu())
        return out


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


class MLPBlock(Block):
    def __init__(self):
        super().__init__(DIM)
        self.drop = _Dropout()

    def forward(self, x):
        return x + _local(self.drop(self.fc2(F.gelu(_local(self.fc1(self.norm(x)))))))


class AttnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.drop = _Dropout()

    def forward(self, x):
        n = self.norm(x)
        # Under tensor parallelism q, k and v hold this rank's heads; -1 keeps the code agnostic.
        q, k, v = (_local(p(n)) for p in (self.q, self.k, self.v))
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + _local(self.drop(self.o(a.transpose(1, 2).reshape(b, s, -1))))


def make_model(block):
    torch.manual_seed(0)
    model = Net(VOCAB, DIM, 0)
    model.layers = nn.ModuleDict({str(i): block() for i in range(LAYERS)})
    return model


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, x.roll(-1, dims=1)


def tp_plan(model, tp, attention):
    """torchtitan's Llama plan: activations between blocks sharded on the sequence over tp."""
    top = {}
    if model.emb is not None:
        top["emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.out is not None:
        top["norm"] = SequenceParallel()
        top["out"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(model, tp, top)
    proj = ("q", "k", "v") if attention else ("fc1",)
    last = "o" if attention else "fc2"
    for block in model.layers.values():
        plan = {"norm": SequenceParallel(), last: RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
        plan.update({p: ColwiseParallel(input_layouts=Shard(1)) for p in proj})
        parallelize_module(block, tp, plan)


def reference(block, masks, dev):
    """Losses and per-step gradients of the whole model on one core, full batch, with the
    parallel run's dropout masks replayed: masks[step][block] is a full (BATCH, SEQ, DIM) mask."""
    model = make_model(block).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = (t.to(dev) for t in data())
    steps = []
    for step in range(STEPS):
        for name, b in model.layers.items():
            b.drop.replay = [masks[step][name].to(dev)]
        loss = loss_fn(model(x), y)
        loss.backward()
        steps.append((loss.item(), {k: p.grad.detach().clone() for k, p in model.named_parameters()}))
        opt.step()
        opt.zero_grad()
    losses, grads = zip(*steps)
    return losses, grads


def _gather_pieces(pieces):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, pieces)
    return [p for rank in out for p in rank]


def _assemble(pieces):
    """masks[step][block] from the pieces of every rank (see _check_shards_differ)."""
    masks = [{} for _ in range(STEPS)]
    for step, name, rows, cols, _, m in pieces:
        full = masks[step].setdefault(name, torch.zeros(BATCH, SEQ, DIM, dtype=torch.bool))
        full[rows][:, cols] = m
    return masks


def _check_shards_differ(pieces):
    """Tensor-parallel shards of one activation drew their own masks (the RNG tracker's offsets).
    A piece is (step, block, rows, seq positions, activation, mask): `activation` names the
    activation of which the tp ranks hold shards."""
    by_key = {}
    for step, name, _, _, act, mask in pieces:
        by_key.setdefault((step, name, act), []).append(mask)
    for k, ms in by_key.items():
        assert len(ms) > 1 and not torch.equal(ms[0], ms[1]), f"tp shards {k} drew the same dropout mask"


def run_pp_dp_tp(case, shape, dev):
    """Pipeline x FSDP2 x TP: every rank trains its stage's shard and checks the full gradients."""
    npp, ndp, ntp = shape
    mesh = init_device_mesh("neuron", shape, mesh_dim_names=("pp", "dp", "tp"))
    stage_idx, dp_idx, tp_idx = (mesh[d].get_local_rank() for d in ("pp", "dp", "tp"))
    mod = stage_module(make_model(MLPBlock), stage_idx, npp).to(dev)
    tp_plan(mod, mesh["tp"], attention=False)
    for block in mod.layers.values():
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(mod, mesh=mesh["dp"])
    # DTensor creates its RNG tracker at the first random op and then broadcasts rank 0's state
    # over the world group, which ranks of later stages do not join until their first
    # microbatch arrives: the pipeline deadlocks. Creating it up front, with a seed per stage
    # (what torchtitan's set_determinism does), avoids the broadcast.
    dtensor_manual_seed(stage_idx, mesh["tp"])
    n_micro = 2
    per_dp = BATCH // ndp
    mb, sq = per_dp // n_micro, SEQ // ntp
    # The stages' shapes, given: PyTorch would otherwise infer them by running the stage on
    # uninitialised inputs, which draws dropout masks of its own.
    tokens, hidden, logits = (mb, SEQ), (mb, sq, DIM), (mb, SEQ, VOCAB)
    # (requires_grad: the gradient of a stage's input goes back to the previous stage.)
    if stage_idx == 0:
        shape_in = torch.zeros(tokens, dtype=torch.long, device=dev)
    else:
        shape_in = torch.empty(hidden, device=dev, requires_grad=True)
    shape_out = torch.empty(logits if stage_idx == npp - 1 else hidden, device=dev, requires_grad=True)
    stage = pp.PipelineStage(
        mod, stage_idx, npp, dev, input_args=shape_in, output_args=shape_out, group=mesh["pp"].get_group()
    )
    schedule = pp.Schedule1F1B(stage, n_microbatches=n_micro, loss_fn=loss_fn)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x, y = data()
    mine = slice(dp_idx * per_dp, (dp_idx + 1) * per_dp)
    pieces, losses, grads = [], [], []
    for step in range(STEPS):
        out = []
        if stage_idx == 0:
            schedule.step(x[mine].to(dev))
        else:
            schedule.step(target=y[mine].to(dev), losses=out)
        if stage_idx == npp - 1:
            loss = torch.stack([t.detach() for t in out]).mean()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
            losses.append(loss.item())
        grads.append({k: p.grad.full_tensor().cpu() for k, p in mod.named_parameters()})
        for name, b in mod.layers.items():
            assert len(b.drop.drawn) == n_micro, f"{name}: {len(b.drop.drawn)} dropout calls"
            for m, mask in enumerate(b.drop.drawn):
                rows = slice(dp_idx * per_dp + m * mb, dp_idx * per_dp + (m + 1) * mb)
                pieces.append((step, name, rows, slice(tp_idx * sq, (tp_idx + 1) * sq), (dp_idx, m), mask))
            b.drop.drawn.clear()
        opt.step()
        opt.zero_grad()
    return _compare(case, MLPBlock, pieces, losses, grads, ntp, dev)


def _compare(case, block, pieces, losses, grads, ntp, dev):
    """Gather every rank's dropout masks, train the one-core reference with them, and compare
    this rank's losses (if it computed any) and full gradients; returns the largest difference."""
    pieces = _gather_pieces(pieces)
    if ntp > 1:
        _check_shards_differ(pieces)
    ref_losses, ref_grads = reference(block, _assemble(pieces), dev)
    worst = 0.0
    for step in range(STEPS):
        if losses:
            assert abs(losses[step] - ref_losses[step]) <= ATOL + RTOL * abs(
                ref_losses[step]
            ), f"{case} step {step}: loss {losses[step]} != single-core {ref_losses[step]}"
        for k, g in grads[step].items():
            want = ref_grads[step][k].cpu()
            worst = max(worst, (g - want).abs().max().item())
            torch.testing.assert_close(g, want, rtol=RTOL, atol=ATOL, msg=f"{case} step {step} {k}")
    assert grads[0], f"{case}: no parameters on this rank"
    return worst


def run_cp_tp(case, shape, dev):
    """Context x tensor parallel (FSDP2 over cp): attention blocks on sequence shards."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options

    ncp, ntp = shape
    mesh = init_device_mesh("neuron", shape, mesh_dim_names=("cp", "tp"))
    cp_idx, tp_idx = mesh["cp"].get_local_rank(), mesh["tp"].get_local_rank()
    model = make_model(AttnBlock).to(dev)
    tp_plan(model, mesh["tp"], attention=True)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh["cp"])
    fully_shard(model, mesh=mesh["cp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _cp_options.enable_load_balance = True  # PyTorch's head-tail order for causal attention
    pieces, losses, grads = [], [], []
    for step in range(STEPS):
        x, y = (t.to(dev) for t in data())
        # Which sequence positions this rank holds after context_parallel's (load-balanced) split.
        pos = torch.arange(SEQ, device=dev).expand(BATCH, SEQ).contiguous()
        with context_parallel(mesh["cp"], buffers=[x, y, pos], buffer_seq_dims=[1, 1, 1]):
            loss = loss_fn(model(x), y)
            loss.backward()
            mine = pos[0].cpu()  # the buffers are restored when the context exits
        loss = loss.detach()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=mesh["cp"].get_group())
        losses.append(loss.item())
        grads.append({k: p.grad.full_tensor().cpu() for k, p in model.named_parameters()})
        # Sequence parallelism splits the rank's positions again over tp.
        sq = len(mine) // ntp
        cols = mine[tp_idx * sq : (tp_idx + 1) * sq]
        for name, b in model.layers.items():
            (mask,) = b.drop.drawn
            pieces.append((step, name, slice(None), cols, cp_idx, mask))
            b.drop.drawn.clear()
        opt.step()
        opt.zero_grad()
    return _compare(case, AttnBlock, pieces, losses, grads, ntp, dev)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", choices=["pp_dp_tp", "cp_tp"], required=True)
    p.add_argument("--mesh", required=True, help="PxDxT for pp_dp_tp, CxT for cp_tp (their product: the ranks)")
    args = p.parse_args()
    shape = tuple(int(d) for d in args.mesh.split("x"))
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))  # rank r on neuron:r
    start = time.perf_counter()
    run = {"pp_dp_tp": run_pp_dp_tp, "cp_tp": run_cp_tp}[args.layout]
    case = f"{args.layout} {args.mesh}"
    worst = torch.tensor(run(case, shape, dev), device=dev)
    peak = torch.tensor(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, device=dev)
    for t in (worst, peak):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(
            f"{case} on {dist.get_world_size()} ranks: losses and gradients equal one core's (largest gradient "
            f"difference {worst.item():.1e}); {time.perf_counter() - start:.1f} s, peak RSS per rank "
            f"{peak.item():.0f} MiB",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
