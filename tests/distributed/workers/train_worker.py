"""Data/tensor-parallel training of a tiny Llama on neuron, checked against a
single-process run; plus a distributed-checkpoint round trip.

Usage (under torchrun): train_worker.py MODE[,MODE...] [CKPT_DIR]
Modes: ddp, ddp_hooks, fsdp2, fsdp2_bf16, tp, tp_sp, fsdp_tp (world 4: 2 x 2 mesh), dcp,
nodes (the node layout of a multi-node torchrun and traffic across its nodes).
Prints "MODE <mode> OK <losses>" per mode.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from tiny_llama import VOCAB, TinyLlama, loss_fn, tp_plan  # noqa: E402

STEPS, BATCH, SEQ = 4, 4, 16


def make_model():
    torch.manual_seed(0)
    return TinyLlama()


def data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return [x] * STEPS  # one batch, fitted repeatedly: the loss must go down


def train(model, params, batches, dev, dp_rank=0, dp_size=1, dp_group=None, autocast=False, foreach=None):
    opt = torch.optim.AdamW(params, lr=1e-2, foreach=foreach)
    losses = []
    per = BATCH // dp_size
    for x in batches:
        x = x[dp_rank * per : (dp_rank + 1) * per].to(dev)
        if autocast:
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = loss_fn(model(x), x)
        else:
            loss = loss_fn(model(x), x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        l = loss.detach().clone()
        if dp_size > 1:
            dist.all_reduce(l, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(float(l.item()))
    return losses


def close(a, b, tol):
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def full_state(model):
    from torch.distributed.tensor import DTensor

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
        for k, v in model.state_dict().items()
    }


def _check_nodes(rank, world, local_rank, dev):
    """torchrun's node layout (--nnodes N): ranks are node-major, each node is a simulated
    instance of its own whose ranks own its cores 0..LOCAL_WORLD_SIZE-1, and collectives
    and point-to-point traffic cross the nodes."""
    node, per_node = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    assert rank == node * per_node + local_rank, (rank, node, per_node, local_rank)
    props = torch.neuron.get_device_properties(local_rank)
    assert props.logical_core_id == local_rank, props
    views = [None] * world
    dist.all_gather_object(views, (node, local_rank, props.instance_type, torch.neuron.device_count()))
    assert [v[:2] for v in views] == [(r // per_node, r % per_node) for r in range(world)], views
    assert len({v[2:] for v in views}) == 1, views  # every node simulates the same instance type
    x = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((3,), world * (world + 1) / 2)), x
    out = torch.empty(world, 2, device=dev)
    dist.all_gather_into_tensor(out, torch.full((1, 2), float(rank), device=dev))
    assert torch.equal(out.cpu(), torch.arange(world, dtype=torch.float32)[:, None].expand(world, 2)), out
    peer = (rank + per_node) % world  # the same local rank on the next node
    recv = torch.empty(2, device=dev)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(rank), device=dev), peer),
        dist.P2POp(dist.irecv, recv, (rank - per_node) % world),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(recv.cpu(), torch.full((2,), float((rank - per_node) % world))), recv


def main():
    modes = sys.argv[1].split(",")
    ckpt_dir = sys.argv[2] if len(sys.argv) > 2 else None
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    assert torch.neuron.current_device() == local_rank
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = data()

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    ref_model = make_model().to(dev)
    ref = train(ref_model, ref_model.parameters(), batches, dev)

    def shard_fsdp(model, mesh, mp=None):
        kw = {"mesh": mesh}
        if mp is not None:
            kw["mp_policy"] = mp
        for layer in model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model

    def apply_tp(model, mesh, sp):
        top, layer_plan = tp_plan(sequence_parallel=sp)
        for layer in model.layers:
            parallelize_module(layer, mesh, layer_plan)
        parallelize_module(model, mesh, top)
        return model

    for mode in modes:
        if mode == "nodes":
            _check_nodes(rank, world, local_rank, dev)
            print(f"rank {rank}: MODE nodes OK", flush=True)
            continue
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(make_model().to(dev), device_ids=[local_rank])
            losses = train(model, model.parameters(), batches, dev, rank, world)
            tol = 1e-4
        elif mode == "ddp_hooks":
            # gradients as bucket views + a Python comm hook that consumes the
            # all_reduce future's value (fp16 compression)
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(make_model().to(dev), device_ids=[local_rank], gradient_as_bucket_view=True, bucket_cap_mb=0.05)
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            losses = train(model, model.parameters(), batches, dev, rank, world)
            assert all(p.grad is None or p.grad.device == dev for p in model.parameters())
            tol = 2e-2
        elif mode in ("fsdp2", "fsdp2_bf16"):
            mesh = init_device_mesh("neuron", (world,))
            mp = (
                MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                if mode == "fsdp2_bf16"
                else None
            )
            model = shard_fsdp(make_model().to(dev), mesh, mp)
            losses = train(model, model.parameters(), batches, dev, rank, world)
            tol = 3e-2 if mp else 1e-4
        elif mode in ("tp", "tp_sp"):
            mesh = init_device_mesh("neuron", (world,))
            model = apply_tp(make_model().to(dev), mesh, sp=mode == "tp_sp")
            # plain TP leaves the norms' weights plain tensors: no foreach over mixed DTensor/Tensor
            losses = train(model, model.parameters(), batches, dev, foreach=False if mode == "tp" else None)
            tol = 1e-4
        elif mode == "fsdp_tp":
            assert world == 4, "fsdp_tp needs 4 processes"
            mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
            model = apply_tp(make_model().to(dev), mesh["tp"], sp=True)
            model = shard_fsdp(model, mesh["dp"])
            dp = mesh["dp"]
            losses = train(model, model.parameters(), batches, dev, dp.get_local_rank(), dp.size(), dp.get_group())
            tol = 1e-4
        elif mode == "dcp":
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import (
                get_model_state_dict,
                get_optimizer_state_dict,
                set_optimizer_state_dict,
            )

            assert ckpt_dir
            mesh = init_device_mesh("neuron", (world,))
            a = shard_fsdp(make_model().to(dev), mesh)
            opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
            x = batches[0][rank * (BATCH // world) : (rank + 1) * (BATCH // world)].to(dev)
            loss_fn(a(x), x).backward()
            opt_a.step()
            opt_a.zero_grad()
            dcp.save(
                {"model": get_model_state_dict(a), "optim": get_optimizer_state_dict(a, opt_a)}, checkpoint_id=ckpt_dir
            )
            torch.manual_seed(99)  # a differently initialised model
            b = shard_fsdp(TinyLlama().to(dev), mesh)
            opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
            sd = {"model": get_model_state_dict(b), "optim": get_optimizer_state_dict(b, opt_b)}
            dcp.load(sd, checkpoint_id=ckpt_dir)
            b.load_state_dict(sd["model"])
            set_optimizer_state_dict(b, opt_b, sd["optim"])
            sa, sb = full_state(a), full_state(b)
            assert sa.keys() == sb.keys()
            for k in sa:
                assert torch.equal(sa[k], sb[k]), f"dcp: {k} differs after load"
            # Resharded load: the FSDP checkpoint into a tensor-parallel model.
            torch.manual_seed(7)
            c = apply_tp(TinyLlama().to(dev), mesh, sp=True)
            sdc = get_model_state_dict(c)
            dcp.load({"model": sdc}, checkpoint_id=ckpt_dir)
            c.load_state_dict(sdc)
            sc = full_state(c)
            for k in sa:
                assert torch.equal(sa[k], sc[k]), f"dcp resharded load: {k} differs"
            # Training continues identically from the loaded state.
            la = train(a, a.parameters(), batches[1:2], dev, rank, world)
            lb_model_opt = opt_b
            x = batches[1][rank * (BATCH // world) : (rank + 1) * (BATCH // world)].to(dev)
            lb = loss_fn(b(x), x).detach()
            dist.all_reduce(lb, op=dist.ReduceOp.AVG)
            assert abs(la[0] - lb.item()) < 1e-6, (la, lb.item())
            assert lb_model_opt.state, "optimizer state restored"
            print(f"rank {rank}: MODE dcp OK {len(sa)} tensors", flush=True)
            continue
        else:
            raise ValueError(mode)
        assert close(losses, ref, tol), f"{mode}: losses {losses} != single-process {ref}"
        assert losses[-1] < losses[0], f"{mode}: loss does not decrease {losses}"
        print(f"rank {rank}: MODE {mode} OK {losses} ref {ref}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
