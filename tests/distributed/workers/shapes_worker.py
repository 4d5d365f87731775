"""Collectives accept what NCCL accepts and check what NCCL checks.

Run under torchrun (any world size >= 2); prints "SHAPES PASSED <n>" on success.
  * Shapes: tensor collectives (all_gather_into_tensor, reduce_scatter_tensor, their
    coalesced forms) need only matching element counts, as on NCCL; the list forms
    accept same-sized tensors of other shapes.
  * Layout: non-contiguous inputs and outputs give the right values (the caller's
    other elements untouched); an output with overlapping memory raises.
  * Mismatches: wrong element counts and output/input dtypes raise typed errors; under
    TORCH_DISTRIBUTED_DEBUG=DETAIL a dtype mismatch between ranks is detected (last).
"""

import datetime
import os
import warnings

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

checks = 0


def check(cond, msg):
    global checks
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {msg}")
    checks += 1


def eq(actual, expected, msg):
    check(actual.device.type == "neuron", f"{msg}: result on {actual.device}")
    a = actual.cpu()
    check(
        a.shape == expected.shape and torch.equal(a, expected.to(a.dtype)),
        f"{msg}: got {a.tolist()} expected {expected.tolist()}",
    )


def raises(exc, match, fn, msg):
    try:
        fn()
    except exc as e:
        check(match in str(e), f"{msg}: {type(e).__name__} without {match!r}: {e}")
        return
    check(False, f"{msg}: no {exc.__name__} raised")


def main():
    # all_gather_into_tensor / reduce_scatter_tensor are deprecated in favour of *_single in
    # torch 2.13; both are checked here
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*is deprecated.*_single")
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", local_rank)
    R = torch.arange(world, dtype=torch.float32)

    def mine(*shape, dtype=torch.float32):
        """arange(numel) + 100 * rank, on this rank's core."""
        n = 1
        for s in shape:
            n *= s
        return (torch.arange(n, dtype=dtype) + 100 * rank).view(shape).to(dev)

    def gathered(n):
        """What an all_gather of mine(n elements) gives, flat."""
        return torch.cat([torch.arange(n, dtype=torch.float32) + 100 * r for r in range(world)])

    # ---- all_gather_into_tensor / reduce_scatter_tensor: only element counts must match.
    for in_shape, out_shape in [
        ((1, 2), (2 * world,)),
        ((2,), (world, 1, 2)),
        ((2, 3), (world, 6)),
        ((3, 2), (3 * world, 2)),
        ((), (world,)),
    ]:
        x = mine(*in_shape) if in_shape else torch.tensor(100.0 * rank, device=dev)
        out = torch.empty(out_shape, device=dev)
        n = max(1, x.numel())
        exp = gathered(n) if in_shape else R * 100
        dist.all_gather_into_tensor(out, x)
        eq(out, exp.view(out_shape), f"all_gather_into_tensor {in_shape} -> {out_shape}")
        out.zero_()
        dist.all_gather_into_tensor(out, x, async_op=True).wait()
        eq(out, exp.view(out_shape), f"all_gather_into_tensor async {in_shape} -> {out_shape}")
        if hasattr(dist, "all_gather_single"):  # its successor's name (torch >= 2.13)
            out.zero_()
            dist.all_gather_single(out, x)
            eq(out, exp.view(out_shape), f"all_gather_single {in_shape} -> {out_shape}")

    for in_shape, out_shape in [((world, 2), (2,)), ((2 * world,), (1, 2)), ((world, 2, 3), (3, 2))]:
        x = mine(*in_shape)
        n = x.numel() // world
        total = sum(torch.arange(x.numel(), dtype=torch.float32) + 100 * r for r in range(world))
        exp = total[rank * n : (rank + 1) * n].view(out_shape)
        for op, scale in [(ReduceOp.SUM, 1.0), (ReduceOp.AVG, 1.0 / world), (dist._make_nccl_premul_sum(2.0), 2.0)]:
            out = torch.empty(out_shape, device=dev)
            dist.reduce_scatter_tensor(out, x, op=op)
            eq(out, exp * scale, f"reduce_scatter_tensor {op} {in_shape} -> {out_shape}")
        if hasattr(dist, "reduce_scatter_single"):
            out = torch.empty(out_shape, device=dev)
            dist.reduce_scatter_single(out, x)
            eq(out, exp, f"reduce_scatter_single {in_shape} -> {out_shape}")
        eq(x, mine(*in_shape).cpu(), "reduce_scatter_tensor leaves its input untouched")

    # the coalesced forms (what FSDP2 and _coalescing_manager issue)
    a, b = mine(1, 2), mine(3)
    oa, ob = torch.empty(2 * world, device=dev), torch.empty(world, 3, device=dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_gather_into_tensor(oa, a)
        dist.all_gather_into_tensor(ob, b)
    cm.wait()
    eq(oa, gathered(2), "coalesced all_gather_into_tensor (1, 2) -> flat")
    eq(ob, gathered(3).view(world, 3), "coalesced all_gather_into_tensor (3,) -> (world, 3)")
    a, b = mine(2 * world), mine(world, 3)
    oa, ob = torch.empty(1, 2, device=dev), torch.empty(3, device=dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.reduce_scatter_tensor(oa, a)
        dist.reduce_scatter_tensor(ob, b)
    cm.wait()
    for out, n, msg in [(oa, 2, "(2w,) -> (1, 2)"), (ob, 3, "(w, 3) -> (3,)")]:
        total = sum(torch.arange(n * world, dtype=torch.float32) + 100 * r for r in range(world))
        eq(out, total[rank * n : (rank + 1) * n].view(out.shape), f"coalesced reduce_scatter_tensor {msg}")

    # list forms with same-sized tensors of other shapes
    outs = [torch.empty(2, device=dev) for _ in range(world)]
    dist.all_gather(outs, mine(1, 2))
    for r in range(world):
        eq(outs[r], torch.arange(2.0) + 100 * r, f"all_gather list (1, 2) -> (2,) [{r}]")
    out = torch.empty(1, 3, device=dev)
    dist.reduce_scatter(out, [mine(3) + r for r in range(world)])
    eq(
        out,
        (sum(torch.arange(3.0) + 100 * r for r in range(world)) + world * rank).view(1, 3),
        "reduce_scatter list (3,) -> (1, 3)",
    )
    gl = [torch.empty(2, 1, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(mine(2), gl, dst=0)
    if rank == 0:
        for r in range(world):
            eq(gl[r], (torch.arange(2.0) + 100 * r).view(2, 1), f"gather (2,) -> (2, 1) [{r}]")
    out = torch.empty(2, device=dev)
    dist.scatter(out, [torch.full((1, 2), float(r), device=dev) for r in range(world)] if rank == 0 else None, src=0)
    eq(out, torch.full((2,), float(rank)), "scatter (1, 2) -> (2,)")
    outs = [torch.empty(1, 2, device=dev) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * rank + r), device=dev) for r in range(world)])
    for r in range(world):
        eq(outs[r], torch.full((1, 2), float(10 * r + rank)), f"all_to_all (2,) -> (1, 2) [{r}]")

    # what NCCL rejects stays rejected, with typed errors naming the sizes
    raises(
        ValueError,
        f"world_size ({world}) times the elements",
        lambda: dist.all_gather_into_tensor(torch.empty(2 * world + 1, device=dev), mine(2)),
        "all_gather_into_tensor, wrong element count",
    )
    raises(
        ValueError,
        f"world_size ({world}) times the elements",
        lambda: dist.reduce_scatter_tensor(torch.empty(3, device=dev), mine(2 * world)),
        "reduce_scatter_tensor, wrong element count",
    )
    raises(
        TypeError,
        "dtype",
        lambda: dist.all_gather_into_tensor(torch.empty(2 * world, device=dev, dtype=torch.int32), mine(2)),
        "all_gather_into_tensor, dtypes differ",
    )

    # ---- non-contiguous tensors: right values, the rest of the caller's memory untouched
    base = mine(8)
    dist.all_reduce(base[::2])
    exp = torch.arange(8.0) + 100 * rank
    exp[::2] = sum(torch.arange(8.0)[::2] + 100 * r for r in range(world))
    eq(base, exp, "all_reduce of base[::2]")
    m = mine(3, 4)
    dist.all_reduce(m.t(), op=ReduceOp.AVG)
    eq(m, sum(torch.arange(12.0).view(3, 4) + 100 * r for r in range(world)) / world, "all_reduce AVG of a transpose")
    m = mine(4, 2)
    w = dist.all_reduce(m[:, 1], async_op=True)
    w.wait()
    exp = torch.arange(8.0).view(4, 2) + 100 * rank
    exp[:, 1] = sum(torch.arange(8.0).view(4, 2)[:, 1] + 100 * r for r in range(world))
    eq(m, exp, "async all_reduce of a column")
    m = mine(3, 2)
    dist.broadcast(m[:, 0], src=0)
    exp = torch.arange(6.0).view(3, 2) + 100 * rank
    exp[:, 0] = torch.arange(6.0).view(3, 2)[:, 0]
    eq(m, exp, "broadcast into a column")
    buf = torch.full((2 * world * 2,), -1.0, device=dev)
    dist.all_gather_into_tensor(buf[::2], mine(2, 2)[:, 0])
    exp = torch.full((4 * world,), -1.0)
    exp[::2] = torch.cat([torch.tensor([0.0, 2.0]) + 100 * r for r in range(world)])
    eq(buf, exp, "all_gather_into_tensor, strided output and input")
    big = mine(world, 4)
    out = torch.full((2, 2), -1.0, device=dev)
    dist.reduce_scatter_tensor(out[:, 0], big[:, ::2])
    total = sum(torch.arange(4.0 * world).view(world, 4) + 100 * r for r in range(world))
    exp = torch.full((2, 2), -1.0)
    exp[:, 0] = total[rank, ::2]
    eq(out, exp, "reduce_scatter_tensor, strided output and input")
    cols = torch.full((2, world), -1.0, device=dev)
    dist.all_gather([cols[:, r] for r in range(world)], mine(2))
    eq(cols, gathered(2).view(world, 2).t(), "all_gather into columns")
    # a ring of isend / irecv: strided send buffers and receive targets
    m = torch.full((2, 2), -1.0, device=dev)
    works = [dist.isend(mine(2, 2)[:, 0], dst=(rank + 1) % world), dist.irecv(m[:, 1], src=(rank - 1) % world)]
    for w in works:
        w.wait()
    src = (rank - 1) % world
    eq(m, torch.tensor([[-1.0, 100.0 * src], [-1.0, 2.0 + 100 * src]]), "isend/irecv of columns")
    dist.barrier()
    raises(
        ValueError,
        "overlapping memory",
        lambda: dist.all_reduce(torch.zeros(1, device=dev).expand(4)),
        "all_reduce into an expanded tensor",
    )
    x = torch.ones(1, device=dev).expand(2)  # an overlapping input is read only: fine
    out = torch.empty(2 * world, device=dev)
    dist.all_gather_into_tensor(out, x)
    eq(out, torch.ones(2 * world), "all_gather_into_tensor of an expanded input")

    # ---- ranks disagreeing on the dtype (same byte size): DETAIL's fingerprint check
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL":
        x = torch.ones(4, device=dev, dtype=torch.float32 if rank == 0 else torch.int32)
        raises(
            RuntimeError,
            "Detected mismatch between collectives",
            lambda: dist.all_reduce(x),
            "all_reduce float32 vs int32 under DETAIL",
        )
        print(f"rank {rank}: SHAPES PASSED {checks}", flush=True)
        os._exit(0)  # the group is unusable after a detected mismatch
    dist.barrier()
    print(f"rank {rank}: SHAPES PASSED {checks}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
