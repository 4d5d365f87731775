"""Bus bandwidth of all_reduce / all_gather / reduce_scatter / all_to_all on neuron tensors
(process group "neuron") vs the same collectives on CPU tensors with plain gloo, at several
world sizes, in one run.

    python benchmarks/collectives.py [--ranks 2,4,8] [--max-mib 16] [--rounds 5]

The script launches itself once per world size under ``torchrun --standalone`` (on a
simulated trn2.48xlarge unless TORCH_NEURONX_INSTANCE_TYPE says otherwise) and prints one
table. Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n for
all_reduce and x (n-1)/n for all_gather / reduce_scatter / all_to_all, where bytes is the
full (gathered / pre-scatter) buffer. Each row is the median of alternating timed blocks
(gloo first in even rounds, neuron first in odd ones), each block timed by its slowest rank.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def sizes(max_bytes):
    s = 4 << 10
    while s <= max_bytes:
        yield s
        s *= 16 if s < 1 << 20 else 4


def _make(op, nbytes, device, group, world):
    import torch
    import torch.distributed as dist

    numel = nbytes // 4
    numel -= numel % world
    if op == "all_reduce":
        x = torch.ones(numel, device=device)
        return (lambda: dist.all_reduce(x, group=group)), numel * 4, 2 * (world - 1) / world
    if op == "all_gather":
        out = torch.empty(numel, device=device)
        inp = torch.ones(numel // world, device=device)
        return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), numel * 4, (world - 1) / world
    if op == "reduce_scatter":
        out = torch.empty(numel // world, device=device)
        inp = torch.ones(numel, device=device)
        return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), numel * 4, (world - 1) / world
    out = torch.empty(numel, device=device)
    inp = torch.ones(numel, device=device)
    return (lambda: dist.all_to_all_single(out, inp, group=group)), numel * 4, (world - 1) / world


def _timed(fn, iters, cpu_group):
    import torch
    import torch.distributed as dist

    dist.barrier(group=cpu_group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu_group)  # the slowest rank's time
    return t.item()


def _compare(op, nbytes, dev, world, iters, rounds, cpu_group):
    """(gloo busbw, neuron busbw) in GB/s: medians of `rounds` alternating timed blocks."""
    import torch.distributed as dist

    cpu_fn, nb, factor = _make(op, nbytes, "cpu", cpu_group, world)
    neu_fn, _, _ = _make(op, nbytes, dev, dist.group.WORLD, world)
    for fn in (cpu_fn, neu_fn):  # warm up
        fn()
    tc, tn = [], []
    for r in range(rounds):
        order = [(cpu_fn, tc), (neu_fn, tn)]
        for fn, acc in order if r % 2 == 0 else order[::-1]:
            acc.append(_timed(fn, iters, cpu_group))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return nb / med(tc) * factor / 1e9, nb / med(tn) * factor / 1e9


def worker(args):
    """One rank under torchrun: rank 0 prints one JSON line per (size, op)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=600))
    world = dist.get_world_size()
    cpu_group = dist.new_group(backend="gloo")  # the plain-gloo baseline (and the timing bookkeeping)
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    for nbytes in sizes(args.max_mib << 20):
        iters = args.iters or max(2, min(50, (16 << 20) // nbytes))
        for op in OPS:
            c, n = _compare(op, nbytes, dev, world, iters, args.rounds, cpu_group)
            if dist.get_rank() == 0:
                print(
                    "ROW " + json.dumps({"world": world, "bytes": nbytes, "op": op, "gloo": c, "neuron": n}), flush=True
                )
    dist.destroy_process_group()


def _fmt_size(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def launch(args):
    rows = []
    for n in args.ranks:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            __file__,
            "--max-mib",
            str(args.max_mib),
            "--rounds",
            str(args.rounds),
            "--iters",
            str(args.iters),
        ]
        # one rank per logical core: a trn2.48xlarge (64 at LNC=2) unless an instance is chosen
        env = {"OMP_NUM_THREADS": "1", "TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", **os.environ}
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{n} ranks failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
        rows += [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")]
        print(f"{n} ranks: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"busbw in GB/s; median of {args.rounds} alternating timed blocks; ratio = neuron / gloo")
    print()
    print("| ranks | size | op | gloo (CPU tensors) | neuron | ratio |")
    print("|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['world']} | {_fmt_size(r['bytes'])} | {r['op']} | {r['gloo']:.3f} | {r['neuron']:.3f} "
            f"| {r['neuron'] / r['gloo']:.3f} |"
        )
    big = [r["neuron"] / r["gloo"] for r in rows if r["bytes"] >= 16 << 20]
    if big:
        gm = math.exp(sum(math.log(x) for x in big) / len(big))
        print()
        print(
            f"At >= 16 MiB: geometric mean ratio {gm:.3f}, lowest {min(big):.3f} over {len(big)} rows "
            f"(target: >= 0.95)"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--ranks",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2, 4, 8],
        help="comma-separated world sizes (default 2,4,8)",
    )
    ap.add_argument("--max-mib", type=int, default=16, help="largest buffer in MiB (default 16)")
    ap.add_argument("--iters", type=int, default=0, help="iterations per timed block (default: by size)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating gloo/neuron timed blocks per row")
    args = ap.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
