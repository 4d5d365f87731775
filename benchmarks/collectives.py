"""Bus bandwidth of all_reduce / all_gather / reduce_scatter on neuron tensors
(process group "neuron") vs the same collectives on CPU tensors with gloo, in
one run.

    torchrun --standalone --nproc_per_node=2 benchmarks/collectives.py [--max-mib 64] [--iters N]

Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw x
2(n-1)/n for all_reduce and (n-1)/n for all_gather / reduce_scatter, where
bytes is the full (gathered / pre-scatter) buffer. Rank 0 prints the table.
"""
import argparse
import datetime
import math
import os
import time

import torch
import torch.distributed as dist


def sizes(max_bytes):
    s = 1024
    while s <= max_bytes:
        yield s
        s *= 4 if s < 1 << 20 else 2


def make(op, nbytes, device, group, world):
    numel = nbytes // 4
    numel -= numel % world
    if op == "all_reduce":
        x = torch.ones(numel, device=device)
        return (lambda: dist.all_reduce(x, group=group)), numel * 4, 2 * (world - 1) / world
    if op == "all_gather":
        out = torch.empty(numel, device=device)
        inp = torch.ones(numel // world, device=device)
        return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), numel * 4, (world - 1) / world
    out = torch.empty(numel // world, device=device)
    inp = torch.ones(numel, device=device)
    return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), numel * 4, (world - 1) / world


def timed(fn, iters, group):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier(group=group)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu_group)  # the slowest rank's time
    return t.item()


def compare(op, nbytes, dev, world, iters, rounds):
    """Median time of `rounds` alternating blocks of cpu-gloo and neuron runs."""
    cpu_fn, nb, factor = make(op, nbytes, "cpu", cpu_group, world)
    neu_fn, _, _ = make(op, nbytes, dev, dist.group.WORLD, world)
    for fn in (cpu_fn, neu_fn):  # warm up
        for _ in range(2):
            fn()
    tc, tn = [], []
    for r in range(rounds):
        order = [(cpu_fn, tc), (neu_fn, tn)]
        for fn, acc in order if r % 2 == 0 else order[::-1]:
            acc.append(timed(fn, iters, cpu_group))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return nb / med(tc) * factor / 1e9, nb / med(tn) * factor / 1e9


def main():
    global cpu_group
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=0, help="iterations per timed block (default: by size)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating cpu/neuron timed blocks per row")
    args = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=300))
    world = dist.get_world_size()
    # A separate plain-gloo group for the CPU baseline (and bookkeeping).
    cpu_group = dist.new_group(backend="gloo")
    dev = torch.device("neuron", local_rank)
    rows = []
    for nbytes in sizes(args.max_mib << 20):
        iters = args.iters or max(3, min(100, (64 << 20) // (nbytes * 4)))
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            c, n = compare(op, nbytes, dev, world, iters, args.rounds)
            rows.append((nbytes, op, c, n))
    if dist.get_rank() == 0:
        print(f"world size {world}; busbw in GB/s (median of {args.rounds} alternating timed blocks)")
        print(f"{'size':>9} | {'op':<14} | {'cpu gloo busbw':>14} | {'neuron busbw':>12} | {'ratio':>6}")
        print("-" * 69)
        for nbytes, op, c, n in rows:
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            print(f"{size:>9} | {op:<14} | {c:>14.3f} | {n:>12.3f} | {c / n:>6.3f}")
        big = [c / n for nbytes, _, c, n in rows if nbytes >= 16 << 20]
        if big:
            gm = math.exp(sum(math.log(r) for r in big) / len(big))
            print(f"geometric mean ratio at >= 16 MiB: {gm:.3f} over {len(big)} rows (max {max(big):.3f})")
        print("ratio = cpu-gloo busbw / neuron busbw (target <= 1.05 at >= 16 MiB)")
    dist.destroy_process_group()


cpu_group = None

if __name__ == "__main__":
    main()
