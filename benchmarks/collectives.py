"""Bus bandwidth of all_reduce / all_gather / reduce_scatter / all_to_all on neuron tensors
(process group "neuron") vs the same collectives on CPU tensors with plain gloo, at several
world sizes, in one run.

    python benchmarks/collectives.py [--ranks 2,4,8] [--ops all_gather,...] [--max-mib 16] [--rounds 5]

The script launches itself once per world size under ``torchrun --standalone`` (on a
simulated trn2.48xlarge unless TORCH_NEURONX_INSTANCE_TYPE says otherwise) and prints one
table. Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n for
all_reduce and x (n-1)/n for all_gather / reduce_scatter / all_to_all, where bytes is the
full (gathered / pre-scatter) buffer. Rounds alternate a timed block of each (gloo first in
even rounds, neuron first in odd ones), each block timed by its slowest rank; the bandwidths
are medians over rounds and the ratio is the median of the rounds' ratios.

Both columns run on the same gloo instance: the "neuron" group's CPU backend is the gloo
backend its neuron tensors use, so CPU tensors on that group are plain gloo over the same
TCP connections. A second gloo group would have connections of its own, and two
connections' speeds differ for the life of the processes (by up to 1.8x between two plain
gloo groups here), which no number of rounds averages out. ``--control`` times CPU tensors
in both columns: its ratios show the measurement's own noise.

``--check-cost`` times instead what the check of collectives (TORCH_NEURONX_CHECK_COLLECTIVES)
costs a small all_reduce of neuron tensors: per call, with the check off (0), with the default
record (1), with the full check before each collective (2), and off again (an A/A control,
whose ratio is the measurement's noise), on the same group's gloo connections (the group is
made with 2 and each block switches it), in blocks rotated in order each round; ratios are
the medians of the rounds' own ratios to the first column.

    python benchmarks/collectives.py --check-cost [--ranks 2] [--sizes 4096,1048576] [--rounds 9]
"""

import argparse
import datetime
import functools
import json
import os
import statistics
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


def _timed(fn, iters, timing_group):
    import torch
    import torch.distributed as dist

    dist.barrier(group=timing_group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=timing_group)  # the slowest rank's time
    return t.item()


def _compare(op, nbytes, dev, world, iters, rounds, timing_group):
    """(gloo busbw, neuron busbw) in GB/s, medians over `rounds` alternating timed blocks, and
    each round's bandwidth ratio neuron / gloo."""
    import torch.distributed as dist

    group = dist.group.WORLD  # CPU tensors on it run on its gloo backend: see the module docstring
    cpu_fn, nb, factor = _make(op, nbytes, "cpu", group, world)
    neu_fn, _, _ = _make(op, nbytes, dev, group, world)
    for fn in (cpu_fn, neu_fn):  # warm up
        fn()
    tc, tn = [], []
    for r in range(rounds):
        order = [(cpu_fn, tc), (neu_fn, tn)]
        for fn, acc in order if r % 2 == 0 else order[::-1]:
            acc.append(_timed(fn, iters, timing_group))
    busbw = lambda t: nb / t * factor / 1e9  # noqa: E731
    return busbw(statistics.median(tc)), busbw(statistics.median(tn)), [c / n for c, n in zip(tc, tn)]


def worker(args):
    """One rank under torchrun: rank 0 prints one JSON line per (size, op)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=600))
    world = dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(backend, dist.ProcessGroupGloo), f"the baseline must be plain gloo, got {type(backend)}"
    assert backend is dist.group.WORLD._get_backend(torch.device("neuron")), "one gloo for both devices"
    timing_group = dist.new_group(backend="gloo")  # barriers and timings, off the measured connections
    dev = "cpu" if args.control else torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    for nbytes in sizes(args.max_mib << 20):
        iters = args.iters or max(2, min(50, (16 << 20) // nbytes))
        for op in args.ops:
            c, n, ratios = _compare(op, nbytes, dev, world, iters, args.rounds, timing_group)
            if dist.get_rank() == 0:
                row = {"world": world, "bytes": nbytes, "op": op, "gloo": c, "neuron": n, "ratios": ratios}
                print("ROW " + json.dumps(row), flush=True)
    dist.destroy_process_group()


# (column, TORCH_NEURONX_CHECK_COLLECTIVES); the second "off" is an A/A control: its ratio is the noise
MODES = (("check off (0)", 0), ("record, the default (1)", 1), ("full check (2)", 2), ("off again (A/A)", 0))


def check_cost(args):
    """One rank under torchrun (the group made with TORCH_NEURONX_CHECK_COLLECTIVES=2): rank 0
    prints one JSON line per size, each column's time per all_reduce in microseconds."""
    import torch
    import torch.distributed as dist

    from torch_neuronx.distributed import hangs

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=600))
    world = dist.get_world_size()
    timing_group = dist.new_group(backend="gloo")  # barriers and timings, off the measured connections
    dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    name = dist.group.WORLD.group_name
    for nbytes in args.sizes:
        fn = functools.partial(dist.all_reduce, torch.ones(nbytes // 4, device=dev))
        iters = args.iters or max(20, min(300, (64 << 20) // (nbytes * 16)))
        times = [[] for _ in MODES]
        for _, mode in MODES:  # warm up
            with hangs._as_mode(name, mode):
                _timed(fn, 5, timing_group)
        for r in range(args.rounds):
            for i in [(i + r) % len(MODES) for i in range(len(MODES))]:  # rotated each round
                with hangs._as_mode(name, MODES[i][1]):
                    times[i].append(_timed(fn, iters, timing_group) * 1e6)
        if dist.get_rank() == 0:
            ratios = [[t / t0 for t, t0 in zip(ts, times[0])] for ts in times[1:]]
            row = {"world": world, "bytes": nbytes, "us": [statistics.median(ts) for ts in times], "ratios": ratios}
            print("ROW " + json.dumps(row), flush=True)
    dist.destroy_process_group()


def launch_check_cost(args):
    rows = []
    for n in args.ranks:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__]
        cmd += ["--check-cost", "--sizes", ",".join(map(str, args.sizes)), "--rounds", str(args.rounds)]
        cmd += ["--iters", str(args.iters)]
        env = {"OMP_NUM_THREADS": "1", **os.environ, "TORCH_NEURONX_CHECK_COLLECTIVES": "2"}
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{n} ranks failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
        rows += [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")]
    print(
        f"us per all_reduce of neuron tensors, medians of {args.rounds} timed blocks in rotated order; ratios to "
        "the check off: the medians of the rounds' own ratios (their middle half in brackets)"
    )
    print()
    print(f"| ranks | size | {' | '.join(label for label, _ in MODES)} | 1 / 0 | 2 / 0 | A/A |")
    print("|---:|---:|" + "---:|" * (len(MODES) + 3))
    for r in rows:
        us = " | ".join(f"{t:.0f}" for t in r["us"])
        ratios = []
        for q in map(sorted, r["ratios"]):
            ratios.append(f"{statistics.median(q):.2f} ({q[len(q) // 4]:.2f}-{q[(3 * len(q)) // 4]:.2f})")
        print(f"| {r['world']} | {_fmt_size(r['bytes'])} | {us} | {' | '.join(ratios)} |")


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
            "--ops",
            ",".join(args.ops),
        ] + (["--control"] if args.control else [])
        # one rank per logical core: a trn2.48xlarge (64 at LNC=2) unless an instance is chosen
        env = {"OMP_NUM_THREADS": "1", "TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", **os.environ}
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{n} ranks failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
        rows += [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")]
        print(f"{n} ranks: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    second = "CPU tensors again (--control)" if args.control else "neuron"
    print(
        f"busbw in GB/s, medians of {args.rounds} alternating timed blocks; ratio = {second} / gloo, "
        "the median of the rounds' ratios (their middle half in the last column)"
    )
    print()
    print(f"| ranks | size | op | gloo (CPU tensors) | {second} | ratio | rounds' ratios |")
    print("|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        q = sorted(r["ratios"])
        print(
            f"| {r['world']} | {_fmt_size(r['bytes'])} | {r['op']} | {r['gloo']:.3f} | {r['neuron']:.3f} "
            f"| {statistics.median(q):.3f} | {q[len(q) // 4]:.2f}-{q[(3 * len(q)) // 4]:.2f} |"
        )
    big = [statistics.median(r["ratios"]) for r in rows if r["bytes"] >= 16 << 20]
    if big:
        gm = statistics.geometric_mean(big)
        print()
        print(
            f"At >= 16 MiB: geometric mean ratio {gm:.3f}, lowest {min(big):.3f} over {len(big)} rows "
            f"(target: >= 0.95)"
        )


def _ops(s):
    ops = [x.strip() for x in s.split(",") if x.strip()]
    unknown = [x for x in ops if x not in OPS]
    if unknown or not ops:
        raise argparse.ArgumentTypeError(f"unknown op(s) {unknown or s!r}; choose from {','.join(OPS)}")
    return ops


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
    ap.add_argument("--ops", type=_ops, default=list(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument(
        "--control",
        action="store_true",
        help="time CPU tensors in both columns (the ratios then show the measurement's noise)",
    )
    ap.add_argument(
        "--check-cost",
        action="store_true",
        help="time a small all_reduce with TORCH_NEURONX_CHECK_COLLECTIVES 0, 1 and 2 instead (default ranks: 2)",
    )
    ap.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4 << 10, 1 << 20],
        help="bytes per all_reduce for --check-cost (default 4096,1048576)",
    )
    args = ap.parse_args()
    if args.check_cost and "LOCAL_RANK" in os.environ:
        check_cost(args)
    elif args.check_cost:
        args.ranks = args.ranks if "--ranks" in sys.argv else [2]
        launch_check_cost(args)
    elif "LOCAL_RANK" in os.environ:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
