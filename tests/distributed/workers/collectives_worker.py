"""Every c10d collective on neuron tensors, checked against expected values.

Run under torchrun (any world size >= 2); prints "CHECKS PASSED <n>" on success.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import ReduceOp

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int64, torch.int32, torch.int8, torch.uint8]
ALL = FLOATS + INTS

checks = 0


def check(cond, msg):
    global checks
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {msg}")
    checks += 1


def eq(actual, expected, msg):
    check(actual.device.type == "neuron", f"{msg}: result on {actual.device}, expected neuron")
    a = actual.cpu()
    e = expected.to(a.dtype) if expected.dtype != a.dtype else expected
    if a.is_floating_point():
        tol = 1e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-6
        ok = a.shape == e.shape and torch.allclose(a.double(), e.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(a, e)
    check(ok, f"{msg}: got {a.flatten()[:8].tolist()} expected {e.flatten()[:8].tolist()}")


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    # Process model: the current device is neuron:LOCAL_RANK from start-up.
    check(torch.neuron.current_device() == local_rank, "current device != LOCAL_RANK")
    # NEURON_TEST_BIND_DEVICE=1: init_process_group(device_id=...), so that
    # subgroups are created by splitting the default group.
    bind = os.environ.get("NEURON_TEST_BIND_DEVICE") == "1"
    dist.init_process_group(
        "neuron", timeout=datetime.timedelta(seconds=60), device_id=torch.device("neuron", local_rank) if bind else None
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", local_rank)
    pg = dist.group.WORLD
    check(dist.get_backend() == "neuron", "backend name")
    # One gloo instance serves both device types.
    check(
        pg._get_backend(torch.device("cpu")) is pg._get_backend(dev)
        or pg._get_backend(torch.device("cpu")).name() == "gloo",
        "cpu backend is gloo",
    )

    # Process model: each rank sees its own logical core and its HBM; the
    # simulated instance is the same for all ranks of the node.
    props = torch.neuron.get_device_properties(local_rank)
    view = (props.instance_type, torch.neuron.device_count(), props.total_memory, props.logical_core_id)
    views = [None] * world
    dist.all_gather_object(views, view)
    check(all(v[0] == view[0] and v[1] == view[1] and v[2] == view[2] for v in views), f"instance views {views}")
    check([v[3] for v in views] == list(range(world)), f"each rank has its own core (single node): {views}")
    check(props.total_memory > 0, "HBM capacity")

    def t(vals, dtype):
        return torch.tensor(vals, dtype=dtype, device=dev)

    ranks = torch.arange(world, dtype=torch.float64)

    # ---- all_reduce: every reduce op, every dtype it applies to.
    for dtype in ALL:
        x = t([rank + 1, 2 * rank + 1, 3], dtype)
        ptr = x.data_ptr()
        dist.all_reduce(x)
        eq(x, torch.tensor([(ranks + 1).sum(), (2 * ranks + 1).sum(), 3 * world]), f"all_reduce SUM {dtype}")
        check(x.data_ptr() == ptr, "all_reduce is in place (no copy)")
        for op, fn in [(ReduceOp.MAX, max), (ReduceOp.MIN, min)]:
            x = t([rank + 1, 5 - rank], dtype)
            dist.all_reduce(x, op=op)
            eq(x, torch.tensor([fn(range(1, world + 1)), fn(5 - r for r in range(world))]), f"all_reduce {op} {dtype}")
        x = t([rank + 1, 1], dtype)
        dist.all_reduce(x, op=ReduceOp.PRODUCT)
        eq(x, torch.tensor([float(torch.arange(1, world + 1).prod()), 1.0]), f"all_reduce PRODUCT {dtype}")
    for dtype in INTS:
        for op, fn in [
            (ReduceOp.BAND, lambda a, b: a & b),
            (ReduceOp.BOR, lambda a, b: a | b),
            (ReduceOp.BXOR, lambda a, b: a ^ b),
        ]:
            vals = [(r * 5 + 3) & 0x7F for r in range(world)]
            x = t([vals[rank]], dtype)
            dist.all_reduce(x, op=op)
            exp = vals[0]
            for v in vals[1:]:
                exp = fn(exp, v)
            eq(x, torch.tensor([exp]), f"all_reduce {op} {dtype}")
    for dtype in FLOATS:
        x = t([rank * 2.0, 4.0], dtype)
        dist.all_reduce(x, op=ReduceOp.AVG)
        eq(x, torch.tensor([(ranks * 2).mean(), 4.0]), f"all_reduce AVG {dtype}")
        x = t([rank + 1.0, 2.0], dtype)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
        eq(x, torch.tensor([(ranks + 1).sum() * 0.5, world * 1.0]), f"all_reduce PREMUL_SUM {dtype}")
        x = t([rank + 1.0], dtype)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor([0.25], device=dev)))
        eq(x, torch.tensor([(ranks + 1).sum() * 0.25]), f"all_reduce PREMUL_SUM tensor factor {dtype}")
    x = t([rank * 3 + 1], torch.int64)
    dist.all_reduce(x, op=ReduceOp.AVG)
    eq(x, torch.tensor([int((ranks * 3 + 1).sum().item()) // world]), "all_reduce AVG int64 (truncates)")
    x = t([True, rank == 0], torch.bool)
    dist.all_reduce(x, op=ReduceOp.MAX)
    eq(x, torch.tensor([True, True]), "all_reduce MAX bool")
    # complex (viewed as real by torch.distributed)
    z = torch.tensor([complex(rank, 1)], dtype=torch.complex64, device=dev)
    dist.all_reduce(z)
    eq(z, torch.tensor([complex(ranks.sum(), world)], dtype=torch.complex64), "all_reduce complex64")

    # async all_reduce: Work object, future value is the neuron tensor.
    x = t([rank + 1.0] * 4, torch.float32)
    w = dist.all_reduce(x, op=ReduceOp.AVG, async_op=True)
    fut = w.get_future()
    w.wait()
    check(w.is_completed() and w.is_success(), "work completed")
    eq(x, torch.full((4,), float((ranks + 1).mean())), "async all_reduce AVG")
    v = fut.wait()
    check(v[0].device.type == "neuron" and v[0].data_ptr() == x.data_ptr(), "future value is the neuron tensor")
    eq(v[0], torch.full((4,), float((ranks + 1).mean())), "future value AVG applied once")
    # Memory a collective wrote is free as soon as the caller drops it after wait(), not
    # whenever gloo's worker thread lets go of its work: peaks must not depend on timing.
    late = 0
    for _ in range(300):
        out = torch.empty(world * 256, device=dev)
        before = torch.neuron.memory_allocated()
        w = dist.all_gather_into_tensor(out, torch.ones(256, device=dev), async_op=True)
        w.wait()
        del w, out
        late += torch.neuron.memory_allocated() != before - world * 256 * 4
    check(late == 0, f"{late} of 300 all_gather outputs were freed after the caller dropped them")

    # ---- all_gather (list / into tensor / coalesced)
    for dtype in ALL + [torch.bool]:
        x = t([rank % 2 == 0, 1] if dtype == torch.bool else [rank, rank + 10], dtype)
        outs = [torch.empty(2, dtype=dtype, device=dev) for _ in range(world)]
        dist.all_gather(outs, x)
        for r in range(world):
            exp = torch.tensor([r % 2 == 0, 1]) if dtype == torch.bool else torch.tensor([r, r + 10])
            eq(outs[r], exp, f"all_gather {dtype} [{r}]")
        out = torch.empty(world * 2, dtype=dtype, device=dev)
        ptr = out.data_ptr()
        dist.all_gather_into_tensor(out, x)
        if dtype != torch.bool:
            eq(
                out,
                torch.stack([torch.tensor([r, r + 10]) for r in range(world)]).flatten(),
                f"all_gather_into_tensor {dtype}",
            )
        check(out.data_ptr() == ptr, "all_gather_into_tensor writes in place")
    outs = [torch.empty(world * 3, device=dev), torch.empty(world, dtype=torch.int64, device=dev)]
    # coalesced: the ProcessGroup API (what _coalescing_manager's fast path calls)
    pg.allgather_into_tensor_coalesced(
        outs, [torch.full((3,), float(rank), device=dev), t([rank * 7], torch.int64)]
    ).wait()
    eq(outs[0], ranks.repeat_interleave(3), "coalesced all_gather_into_tensor [0]")
    eq(outs[1], (ranks * 7).long(), "coalesced all_gather_into_tensor [1]")

    # ---- reduce_scatter (list / tensor / AVG / PREMUL_SUM / coalesced)
    for dtype in FLOATS + [torch.int64, torch.int32]:
        ins = [t([rank + r, 1], dtype) for r in range(world)]
        out = torch.empty(2, dtype=dtype, device=dev)
        dist.reduce_scatter(out, ins)
        eq(out, torch.tensor([(ranks + rank).sum(), world]), f"reduce_scatter {dtype}")
        inp = torch.arange(world * 2, device=dev).to(dtype) + rank
        before = inp.cpu().clone()
        out = torch.empty(2, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        exp = (torch.arange(world * 2, dtype=torch.float64) * world + ranks.sum())[rank * 2 : rank * 2 + 2]
        eq(out, exp, f"reduce_scatter_tensor {dtype}")
        if dtype in FLOATS:
            dist.reduce_scatter_tensor(out, inp, op=ReduceOp.AVG)
            eq(out, exp / world, f"reduce_scatter_tensor AVG {dtype}")
            dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(1.0 / world))
            eq(out, exp / world, f"reduce_scatter_tensor PREMUL_SUM {dtype}")
            check(torch.equal(inp.cpu(), before), "PREMUL_SUM reduce_scatter leaves its input untouched")
            dist.reduce_scatter(out, ins, op=dist._make_nccl_premul_sum(2.0))
            eq(out, torch.tensor([(ranks + rank).sum() * 2, world * 2]), f"reduce_scatter list PREMUL_SUM {dtype}")
            eq(ins[0], torch.tensor([rank, 1]), "reduce_scatter list inputs untouched")
    outs = [torch.empty(2, device=dev), torch.empty(1, device=dev)]
    ins = [torch.ones(world * 2, device=dev) * (rank + 1), torch.ones(world, device=dev)]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = ReduceOp.AVG
    pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
    eq(outs[0], torch.full((2,), float((ranks + 1).mean())), "coalesced reduce_scatter_tensor AVG")
    eq(outs[1], torch.full((1,), 1.0), "coalesced reduce_scatter_tensor AVG [1]")
    outs = [[torch.empty(2, device=dev), torch.empty(1, device=dev)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [torch.full((2,), rank + 0.5, device=dev), t([rank], torch.float32)])
    for r in range(world):
        eq(outs[r][0], torch.full((2,), r + 0.5), "all_gather_coalesced [0]")
        eq(outs[r][1], torch.tensor([r]), "all_gather_coalesced [1]")
    # _coalescing_manager fast path (without device=: gloo has no start/endCoalescing)
    outs = [torch.empty(world * 2, device=dev), torch.empty(world, device=dev)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(rank), device=dev))
        dist.all_gather_into_tensor(outs[1], t([rank * 3.0], torch.float32))
    eq(outs[0], ranks.repeat_interleave(2), "_coalescing_manager all_gather [0]")
    eq(outs[1], ranks * 3, "_coalescing_manager all_gather [1]")
    outs = [torch.empty(2, device=dev), torch.empty(1, device=dev)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(outs[0], torch.ones(world * 2, device=dev) * (rank + 1), op=ReduceOp.AVG)
        dist.reduce_scatter_tensor(outs[1], torch.ones(world, device=dev) * (rank + 1), op=ReduceOp.AVG)
    eq(outs[0], torch.full((2,), float((ranks + 1).mean())), "_coalescing_manager reduce_scatter AVG [0]")
    eq(outs[1], torch.full((1,), float((ranks + 1).mean())), "_coalescing_manager reduce_scatter AVG [1]")
    xs = [torch.ones(3, device=dev) * rank, torch.ones(1, device=dev) * rank]
    with dist._coalescing_manager():
        for x in xs:
            dist.all_reduce(x)
    eq(xs[0], torch.full((3,), float(ranks.sum())), "_coalescing_manager all_reduce [0]")
    eq(xs[1], torch.full((1,), float(ranks.sum())), "_coalescing_manager all_reduce [1]")
    # ... and with device= (start/end coalescing): one Work for everything issued
    outs = [torch.empty(world * 2, device=dev), torch.empty(world, device=dev)]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(rank), device=dev))
        dist.all_gather_into_tensor(outs[1], t([rank * 3.0], torch.float32))
    fut_vals = cm.works[0].get_future().wait()
    check(all(v.device.type == "neuron" for v in fut_vals), "coalesced future values are neuron tensors")
    cm.wait()
    eq(outs[0], ranks.repeat_interleave(2), "_coalescing_manager(device) all_gather [0]")
    eq(outs[1], ranks * 3, "_coalescing_manager(device) all_gather [1]")
    xs = [torch.ones(3, device=dev) * rank, torch.ones(1, device=dev) * rank]
    with dist._coalescing_manager(device=dev):
        for x in xs:
            dist.all_reduce(x, op=ReduceOp.AVG)
    eq(xs[0], torch.full((3,), float(ranks.mean())), "_coalescing_manager(device) all_reduce AVG [0]")
    eq(xs[1], torch.full((1,), float(ranks.mean())), "_coalescing_manager(device) all_reduce AVG [1]")
    ys = [torch.empty(2, device=dev) for _ in range(world)]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:  # not a fast-path op
        w = dist.all_gather(ys, torch.full((2,), rank + 0.25, device=dev), async_op=True)
    cm.wait()
    for r in range(world):
        eq(ys[r], torch.full((2,), r + 0.25), "_coalescing_manager(device) async all_gather")
    xs = [torch.full((2,), rank + 1.0, device=dev), t([rank + 1.0], torch.float32)]
    dist.all_reduce_coalesced(xs, op=ReduceOp.AVG)
    eq(xs[0], torch.full((2,), float((ranks + 1).mean())), "all_reduce_coalesced AVG [0]")
    eq(xs[1], torch.full((1,), float((ranks + 1).mean())), "all_reduce_coalesced AVG [1]")

    # ---- broadcast / reduce / gather / scatter
    for dtype in ALL:
        for src in range(world):
            x = t([src * 3 + 1, 2], dtype) if rank == src else torch.zeros(2, dtype=dtype, device=dev)
            dist.broadcast(x, src=src)
            eq(x, torch.tensor([src * 3 + 1, 2]), f"broadcast {dtype} src={src}")
        x = t([rank + 1], dtype)
        dist.reduce(x, dst=world - 1)
        if rank == world - 1:
            eq(x, torch.tensor([(ranks + 1).sum()]), f"reduce {dtype}")
        x = t([rank, rank * 2], dtype)
        gl = [torch.empty(2, dtype=dtype, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gl, dst=0)
        if rank == 0:
            for r in range(world):
                eq(gl[r], torch.tensor([r, 2 * r]), f"gather {dtype} [{r}]")
        out = torch.empty(2, dtype=dtype, device=dev)
        sl = [t([r, r + 1], dtype) for r in range(world)] if rank == 0 else None
        dist.scatter(out, sl, src=0)
        eq(out, torch.tensor([rank, rank + 1]), f"scatter {dtype}")
    x = torch.ones(3, device=dev) * (rank + 1)
    dist.reduce(x, dst=0, op=ReduceOp.AVG)
    if rank == 0:
        eq(x, torch.full((3,), float((ranks + 1).mean())), "reduce AVG")

    # ---- all_to_all (list, uneven) and all_to_all_single (even, uneven splits)
    # rank r sends (r + d + 1) elements of value 100 r + d to rank d.
    for dtype in [torch.float32, torch.bfloat16, torch.int64]:
        ins = [torch.full((rank + d + 1,), 100 * rank + d, dtype=dtype, device=dev) for d in range(world)]
        outs = [torch.empty(s + rank + 1, dtype=dtype, device=dev) for s in range(world)]
        dist.all_to_all(outs, ins)
        for s in range(world):
            eq(outs[s], torch.full((s + rank + 1,), 100 * s + rank), f"all_to_all uneven {dtype} from {s}")
        in_splits = [rank + d + 1 for d in range(world)]
        out_splits = [s + rank + 1 for s in range(world)]
        inp = torch.cat(ins)
        out = torch.empty(sum(out_splits), dtype=dtype, device=dev)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        eq(
            out,
            torch.cat([torch.full((s + rank + 1,), 100 * s + rank) for s in range(world)]),
            f"all_to_all_single uneven {dtype}",
        )
        inp = torch.arange(world * 2, device=dev).to(dtype) + 100 * rank
        out = torch.empty(world * 2, dtype=dtype, device=dev)
        dist.all_to_all_single(out, inp)
        eq(
            out,
            torch.cat([torch.arange(rank * 2, rank * 2 + 2) + 100 * s for s in range(world)]),
            f"all_to_all_single {dtype}",
        )

    # ---- point to point: send/recv, isend/irecv, batch_isend_irecv, any source
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.uint8]:
        if rank % 2 == 0:
            dist.send(t([rank, 7], dtype), dst=nxt)
            y = torch.empty(2, dtype=dtype, device=dev)
            dist.recv(y, src=prv)
        else:
            y = torch.empty(2, dtype=dtype, device=dev)
            dist.recv(y, src=prv)
            dist.send(t([rank, 7], dtype), dst=nxt)
        eq(y, torch.tensor([prv, 7]), f"send/recv {dtype}")
    y = torch.empty(3, device=dev)
    works = [dist.isend(torch.full((3,), rank + 0.5, device=dev), dst=nxt), dist.irecv(y, src=prv)]
    for w in works:
        w.wait()
    eq(y, torch.full((3,), prv + 0.5), "isend/irecv")
    y = torch.empty(2, device=dev)
    ops = [dist.P2POp(dist.isend, torch.full((2,), rank * 1.0, device=dev), nxt), dist.P2POp(dist.irecv, y, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    eq(y, torch.full((2,), prv * 1.0), "batch_isend_irecv")
    if rank == 0:
        got = set()
        for _ in range(world - 1):
            y = torch.empty(1, dtype=torch.int64, device=dev)
            src = dist.recv(y)  # any source
            check(int(y.item()) == src * 11, "recv any source value")
            got.add(src)
        check(got == set(range(1, world)), "recv any source senders")
    else:
        dist.send(t([rank * 11], torch.int64), dst=0)

    # ---- barrier: default group, device_ids, subgroups
    dist.barrier()
    dist.barrier(device_ids=[local_rank])
    w = dist.barrier(async_op=True)
    w.wait()

    # ---- subgroups, including one-rank groups
    evens = [r for r in range(world) if r % 2 == 0]
    odds = [r for r in range(world) if r % 2 == 1]
    g_even, g_odd = dist.new_group(evens), dist.new_group(odds)
    singles = [dist.new_group([r]) for r in range(world)]
    mine = g_even if rank % 2 == 0 else g_odd
    members = evens if rank % 2 == 0 else odds
    x = t([rank + 1.0], torch.float32)
    dist.all_reduce(x, group=mine)
    eq(x, torch.tensor([sum(r + 1 for r in members)]), "subgroup all_reduce")
    x = t([rank + 1.0], torch.float32)
    dist.all_reduce(x, op=ReduceOp.AVG, group=mine)
    eq(x, torch.tensor([sum(r + 1 for r in members) / len(members)]), "subgroup all_reduce AVG")
    out = torch.empty(len(members), device=dev)
    dist.all_gather_into_tensor(out, t([rank * 1.0], torch.float32), group=mine)
    eq(out, torch.tensor(members, dtype=torch.float32), "subgroup all_gather_into_tensor")
    dist.barrier(group=mine)
    dist.barrier(group=mine, device_ids=[local_rank])
    x = t([rank + 3.0], torch.float32)
    dist.broadcast(x, src=members[-1], group=mine)
    eq(x, torch.tensor([members[-1] + 3.0]), "subgroup broadcast (global src rank)")
    one = singles[rank]
    x = t([rank + 2.0], torch.float32)
    dist.all_reduce(x, group=one)
    eq(x, torch.tensor([rank + 2.0]), "one-rank group all_reduce")
    dist.all_reduce(x, op=ReduceOp.AVG, group=one)
    eq(x, torch.tensor([rank + 2.0]), "one-rank group all_reduce AVG")
    dist.barrier(group=one)
    if len(members) >= 2:  # p2p inside a subgroup
        i = members.index(rank)
        peer = members[(i + 1) % len(members)]
        back = members[(i - 1) % len(members)]
        y = torch.empty(1, device=dev)
        ws = [dist.isend(t([rank * 1.0], torch.float32), dst=peer, group=mine), dist.irecv(y, src=back, group=mine)]
        for w in ws:
            w.wait()
        eq(y, torch.tensor([back * 1.0]), "subgroup isend/irecv")

    # ---- functional collectives (what DTensor uses)
    x = torch.arange(4, dtype=torch.float32, device=dev) + rank
    r = funcol.all_reduce(x, "sum", pg)
    eq(r, torch.arange(4, dtype=torch.float64) * world + ranks.sum(), "funcol all_reduce")
    r = funcol.all_reduce(x, "avg", pg)
    eq(r, torch.arange(4, dtype=torch.float64) + ranks.mean(), "funcol all_reduce avg")
    g = funcol.all_gather_tensor(x, 0, pg)
    eq(g, torch.cat([torch.arange(4, dtype=torch.float64) + s for s in range(world)]), "funcol all_gather_tensor")
    big = torch.arange(world * 2, dtype=torch.float32, device=dev) + rank
    rs = funcol.reduce_scatter_tensor(big, "sum", 0, pg)
    eq(
        rs,
        (torch.arange(world * 2, dtype=torch.float64) * world + ranks.sum())[rank * 2 : rank * 2 + 2],
        "funcol reduce_scatter_tensor",
    )
    rs = funcol.reduce_scatter_tensor(big, "avg", 0, pg)
    eq(
        rs,
        (torch.arange(world * 2, dtype=torch.float64) + ranks.mean())[rank * 2 : rank * 2 + 2],
        "funcol reduce_scatter_tensor avg",
    )
    a2a = funcol.all_to_all_single(torch.arange(world, dtype=torch.float32, device=dev) + 10 * rank, None, None, pg)
    eq(a2a, torch.tensor([rank + 10.0 * s for s in range(world)]), "funcol all_to_all_single")
    bc = funcol.broadcast(t([rank + 5.0], torch.float32), 0, pg)
    eq(bc, torch.tensor([5.0]), "funcol broadcast")

    # ---- DTensor redistribute on a neuron DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (world,))
    check(mesh.device_type == "neuron", "mesh device type")
    torch.manual_seed(0)
    full = torch.randn(world * 2, 3)
    dt = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    check(dt.to_local().device.type == "neuron", "DTensor local shard on neuron")
    eq(dt.to_local(), full[rank * 2 : rank * 2 + 2], "DTensor Shard(0) local")
    eq(dt.redistribute(mesh, [Replicate()]).to_local(), full, "DTensor Shard->Replicate")
    eq(dt.full_tensor(), full, "DTensor full_tensor")
    eq((dt * 2).sum().full_tensor(), (full * 2).sum().reshape(()), "DTensor sum (partial -> replicate)")

    # ---- object collectives (DCP / accelerate use these)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    check(objs == [{"rank": r} for r in range(world)], "all_gather_object")
    lst = [{"a": 1}] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    check(lst == [{"a": 1}], "broadcast_object_list")

    # ---- CPU tensors on the same group (gloo)
    c = torch.ones(2) * rank
    dist.all_reduce(c)
    check(torch.equal(c, torch.full((2,), float(ranks.sum()))), "cpu all_reduce on the neuron group")

    # ---- wrong device: a clear error, raised locally before anything is sent
    try:
        outs = [torch.empty(1) for _ in range(world)]  # CPU outputs, neuron input
        dist.all_gather(outs, t([1.0], torch.float32))
    except (RuntimeError, ValueError) as e:
        check("neuron" in str(e) and "cpu" in str(e), f"wrong device message: {e}")
    else:
        check(False, "mixing cpu and neuron tensors must raise")
    dist.barrier()

    print(f"rank {rank}: CHECKS PASSED {checks}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
