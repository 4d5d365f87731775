"""Eager-mode performance of the ``neuron`` device against native CPU PyTorch.

The simulator runs every ATen op through its CPU kernel on zero-copy views of
device memory, so the only cost it should add is dispatch overhead. This
benchmark measures that overhead three ways and prints one table:

1. per-op overhead: tight loops of tiny ops, (neuron - cpu) microseconds/op;
2. GPT-2 124M forward (random init, batch 1, seq 128, eval, no_grad);
3. a small GPT-2 training step (4 layers, d=256, batch 4, seq 128, AdamW).

CPU and neuron measurements are interleaved (alternating which goes first) in
the same process with the same thread count, and medians are reported. The
per-op overhead is the median of paired (same-round) differences; the model
ratio is the median of paired (back-to-back) neuron/cpu ratios, which is far
less sensitive to other load on the machine than the ratio of the two medians
(also shown, as "of medians").

    python benchmarks/eager.py                 # full run (~1-2 min)
    python benchmarks/eager.py --quick         # smoke run (~20 s)
    python benchmarks/eager.py --json out.json # also save the results
    python benchmarks/eager.py --cpu-time      # process CPU time, 1 thread (busy machine)
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402  (autoloads torch_neuronx)

DEVICES = ("cpu", "neuron")

# The timer for all measurements: wall time by default; --cpu-time switches to
# the process CPU time (with one intra-op thread), which other processes on
# a busy machine cannot inflate.
CLOCK = time.perf_counter

TARGET_OVERHEAD_US = 0.5
TARGET_FWD_RATIO = 1.02
TARGET_TRAIN_RATIO = 1.05


# ---------------------------------------------------------------------------
# Helpers
def sync(device: str) -> None:
    if device == "neuron":
        torch.neuron.synchronize()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def order(rep: int):
    """Alternate which device goes first so drift/noise hits both equally."""
    return DEVICES if rep % 2 == 0 else DEVICES[::-1]


def interleaved(run: dict, reps: int, warmup: int) -> dict:
    """run[device]() -> seconds. Returns per-device sample lists (interleaved)."""
    for w in range(warmup):
        for d in order(w):
            run[d]()
    samples = {d: [] for d in DEVICES}
    for r in range(reps):
        for d in order(r):
            samples[d].append(run[d]())
    return samples


# ---------------------------------------------------------------------------
# 1. Per-op overhead
def _loop_add_inplace_scalar(n, x):
    f = x.add_
    for _ in range(n):
        f(1)


def _loop_add_tensors(n, a, b):
    add = torch.add
    for _ in range(n):
        add(a, b)


def _loop_mul_inplace_float(n, x):
    f = x.mul_
    for _ in range(n):
        f(1.0)


def _loop_view(n, x):
    f = x.view
    for _ in range(n):
        f(-1)


MICRO_OPS = [
    # (label, loop fn, tensor factory(device) -> args)
    ("x.add_(1)  [1 elem]", _loop_add_inplace_scalar, lambda d: (torch.zeros(1, device=d),)),
    ("torch.add(a, b)  [64 elem]", _loop_add_tensors, lambda d: (torch.ones(64, device=d), torch.ones(64, device=d))),
    ("x.mul_(1.0)  [64 elem]", _loop_mul_inplace_float, lambda d: (torch.ones(64, device=d),)),
    ("x.view(-1)  [64 elem]", _loop_view, lambda d: (torch.ones(64, device=d),)),
]


def bench_micro(rounds: int, iters: int) -> list[dict]:
    results = []
    for label, loop, make in MICRO_OPS:
        args = {d: make(d) for d in DEVICES}

        def timed(d, loop=loop, args=args):
            sync(d)
            t0 = CLOCK()
            loop(iters, *args[d])
            sync(d)
            return (CLOCK() - t0) / iters * 1e6  # us/op

        s = interleaved({d: (lambda d=d: timed(d)) for d in DEVICES}, rounds, warmup=2)
        diffs = [n - c for c, n in zip(s["cpu"], s["neuron"])]
        cpu_us, neu_us = median(s["cpu"]), median(s["neuron"])
        overhead = median(diffs)  # median of paired (same-round) differences
        results.append(
            {
                "kind": "per-op",
                "name": label,
                "cpu_us": cpu_us,
                "neuron_us": neu_us,
                "overhead_us": overhead,
                "target_us": TARGET_OVERHEAD_US,
                "met": overhead <= TARGET_OVERHEAD_US,
                "rounds": rounds,
                "iters_per_round": iters,
                "samples_cpu_us": s["cpu"],
                "samples_neuron_us": s["neuron"],
            }
        )
    return results


# ---------------------------------------------------------------------------
# 2. GPT-2 124M forward
def bench_gpt2_forward(reps: int, warmup: int) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model_cpu = GPT2LMHeadModel(GPT2Config()).eval()
    model_neu = copy.deepcopy(model_cpu).to("neuron")
    ids_cpu = torch.randint(0, model_cpu.config.vocab_size, (1, 128))
    ids = {"cpu": ids_cpu, "neuron": ids_cpu.to("neuron")}
    models = {"cpu": model_cpu, "neuron": model_neu}

    def step(d):
        with torch.no_grad():
            sync(d)
            t0 = CLOCK()
            out = models[d](ids[d])
            sync(d)
            dt = CLOCK() - t0
        del out
        return dt

    s = interleaved({d: (lambda d=d: step(d)) for d in DEVICES}, reps, warmup)
    with torch.no_grad():
        max_diff = (models["cpu"](ids["cpu"]).logits - models["neuron"](ids["neuron"]).logits.cpu()).abs().max()
    res = _ratio_result("GPT-2 124M fwd  [b1 s128]", s, TARGET_FWD_RATIO)
    res["max_abs_logit_diff"] = float(max_diff)
    res["attn_implementation"] = model_cpu.config._attn_implementation
    models.clear()
    del model_cpu, model_neu
    gc.collect()
    return res


# ---------------------------------------------------------------------------
# 3. Small GPT-2 training step
def bench_gpt2_train(reps: int, warmup: int, foreach) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4)
    torch.manual_seed(0)
    model_cpu = GPT2LMHeadModel(cfg).train()
    model_neu = copy.deepcopy(model_cpu).to("neuron")
    models = {"cpu": model_cpu, "neuron": model_neu}
    # With foreach=None torch picks the single-tensor loop on CPU but the
    # foreach implementation on neuron (a PrivateUse1 device), so by default
    # both are pinned to the same implementation to compare devices, not
    # optimizer algorithms.
    opts = {d: torch.optim.AdamW(models[d].parameters(), lr=1e-4, foreach=foreach) for d in DEVICES}
    ids_cpu = torch.randint(0, cfg.vocab_size, (4, 128))
    ids = {"cpu": ids_cpu, "neuron": ids_cpu.to("neuron")}
    losses = {d: [] for d in DEVICES}

    def step(d):
        m, opt, x = models[d], opts[d], ids[d]
        sync(d)
        t0 = CLOCK()
        opt.zero_grad(set_to_none=True)
        loss = m(x, labels=x).loss
        loss.backward()
        opt.step()
        sync(d)
        dt = CLOCK() - t0
        losses[d].append(float(loss.detach()))
        return dt

    s = interleaved({d: (lambda d=d: step(d)) for d in DEVICES}, reps, warmup)
    res = _ratio_result("GPT-2 train step  [4L d256 b4 s128 AdamW]", s, TARGET_TRAIN_RATIO)
    res["final_loss_cpu"] = losses["cpu"][-1]
    res["final_loss_neuron"] = losses["neuron"][-1]
    res["adamw_impl"] = {d: ("foreach" if _uses_foreach(opts[d]) else "for-loop") for d in DEVICES}
    models.clear()
    opts.clear()
    del model_cpu, model_neu
    gc.collect()
    return res


def _uses_foreach(opt) -> bool:
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in opt.param_groups for p in g["params"]]
    if opt.defaults.get("foreach") is not None:
        return bool(opt.defaults["foreach"])
    return _default_to_fused_or_foreach(params, False, False)[1]


def _ratio_result(name, s, target):
    cpu_ms = median(s["cpu"]) * 1e3
    neu_ms = median(s["neuron"]) * 1e3
    of_medians = neu_ms / cpu_ms
    ratio = median([n / c for c, n in zip(s["cpu"], s["neuron"])])
    return {
        "kind": "ratio",
        "name": name,
        "cpu_ms": cpu_ms,
        "neuron_ms": neu_ms,
        "ratio": ratio,
        "ratio_of_medians": of_medians,
        "cpu_ms_min": min(s["cpu"]) * 1e3,
        "neuron_ms_min": min(s["neuron"]) * 1e3,
        "target_ratio": target,
        "met": ratio <= target,
        "reps": len(s["cpu"]),
        "samples_cpu_s": s["cpu"],
        "samples_neuron_s": s["neuron"],
    }


# ---------------------------------------------------------------------------
# Output
def rows_for(results):
    rows = []
    for r in results:
        if r["kind"] == "per-op":
            rows.append(
                [
                    r["name"],
                    f"{r['cpu_us']:.3f} us",
                    f"{r['neuron_us']:.3f} us",
                    f"{r['overhead_us']:+.3f} us/op",
                    f"<= {r['target_us']} us",
                    "yes" if r["met"] else "NO",
                ]
            )
        else:
            rows.append(
                [
                    r["name"],
                    f"{r['cpu_ms']:.2f} ms",
                    f"{r['neuron_ms']:.2f} ms",
                    f"{r['ratio']:.3f}x (of medians {r['ratio_of_medians']:.3f})",
                    f"<= {r['target_ratio']:.2f}x",
                    "yes" if r["met"] else "NO",
                ]
            )
    return rows


def _ext_info(mod) -> dict:
    path = mod._C.__file__
    st = os.stat(path)
    return {"path": path, "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)), "size": st.st_size}


HEADERS = ["benchmark", "cpu", "neuron", "ratio / overhead", "target", "met?"]


def print_table(results, title, plain=False):
    rows = rows_for(results)
    if not plain:
        try:
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            t = Table(title=title)
            for i, h in enumerate(HEADERS):
                t.add_column(h, justify="left" if i == 0 else "right")
            for row in rows:
                t.add_row(*(escape(c) for c in row))
            Console(width=max(120, Console().width)).print(t)
            return
        except ImportError:
            pass
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    line = "  ".join(h.ljust(w) for h, w in zip(HEADERS, widths))
    print(title)
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (fewer repetitions)")
    p.add_argument("--json", metavar="PATH", help="save results as JSON")
    p.add_argument("--plain", action="store_true", help="plain-text table instead of rich")
    p.add_argument("--skip", default="", help="comma list of sections to skip: micro,fwd,train")
    p.add_argument(
        "--adamw-foreach",
        choices=["true", "false", "default"],
        default="true",
        help="AdamW implementation for both devices (default: true; 'default' lets torch "
        "choose per device, which differs between cpu and neuron)",
    )
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with time.process_time and 1 intra-op thread instead of wall time "
        "(robust to other load on the machine)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads for both devices (default: torch.get_num_threads()); "
        "1 is far less sensitive to other load on a small machine",
    )
    args = p.parse_args(argv)

    if not torch.neuron.is_available():
        sys.exit("neuron device not available")

    global CLOCK
    if args.cpu_time:
        if args.threads not in (None, 1):
            p.error("--cpu-time needs --threads 1 (idle OpenMP workers would spin)")
        args.threads = 1
        CLOCK = time.process_time
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)  # both devices run in this process with this one pool
    if args.quick:
        micro_rounds, micro_iters = 5, 5000
        fwd_reps, fwd_warm = 5, 2
        train_reps, train_warm = 5, 2
    else:
        micro_rounds, micro_iters = 21, 20000
        fwd_reps, fwd_warm = 20, 3
        train_reps, train_warm = 15, 2
    skip = set(filter(None, args.skip.split(",")))

    import torch_neuronx

    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load0 > 0.5 * (os.cpu_count() or 1):
        print(
            f"warning: load average is {load0:.2f} on {os.cpu_count()} CPUs; " "timings will be noisy", file=sys.stderr
        )
    torch_neuronx.clear_op_tracking()
    results = []
    t_start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if "micro" not in skip:
            results += bench_micro(micro_rounds, micro_iters)
        if "fwd" not in skip:
            results.append(bench_gpt2_forward(fwd_reps, fwd_warm))
        if "train" not in skip:
            foreach = {"true": True, "false": False, "default": None}[args.adamw_foreach]
            results.append(bench_gpt2_train(train_reps, train_warm, foreach))
    elapsed = time.perf_counter() - t_start
    load = os.getloadavg() if hasattr(os, "getloadavg") else None

    title = (
        f"torch-neuronx eager vs CPU  (torch {torch.__version__}, {threads} threads, "
        f"{'quick' if args.quick else 'full'} run, {'process CPU time' if args.cpu_time else 'wall time'}, "
        f"{elapsed:.0f}s)"
    )
    print_table(results, title, plain=args.plain)
    notes = []
    for r in results:
        if "max_abs_logit_diff" in r:
            notes.append(
                f"fwd: max |logits cpu - neuron| = {r['max_abs_logit_diff']:.3g}, "
                f"attention = {r['attn_implementation']}"
            )
        if "adamw_impl" in r:
            notes.append(
                f"train: AdamW impl cpu={r['adamw_impl']['cpu']} neuron={r['adamw_impl']['neuron']}; "
                f"final loss cpu={r['final_loss_cpu']:.4f} neuron={r['final_loss_neuron']:.4f}"
            )
    fallbacks = torch_neuronx.get_fallback_ops()
    if fallbacks:
        notes.append(
            "ops recorded as CPU fallback: " + ", ".join(f"{k} ({'; '.join(v)})" for k, v in fallbacks.items())
        )
    if load is not None:
        notes.append(
            f"load average after run: {load[0]:.2f} (machine has {os.cpu_count()} CPUs; "
            "other processes inflate noise)"
        )
    for n in notes:
        print("  " + n)

    if args.json:
        out = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "threads": threads,
            "clock": CLOCK.__name__,
            "mode": "quick" if args.quick else "full",
            "elapsed_s": elapsed,
            "loadavg": load,
            "torch_neuronx_C": _ext_info(torch_neuronx),
            "results": results,
            "fallback_ops": fallbacks,
            "warnings": sorted({str(w.message) for w in caught}),
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"  saved {args.json}")
    return 0 if all(r["met"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
