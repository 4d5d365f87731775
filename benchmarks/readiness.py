"""Overhead of recording a run for the readiness report (``torch-neuronx check``) vs plain eager.

A realistic small training step: GPT-2 (transformers, random init from a config; default
6 layers, d=512, 8 heads, batch 4, seq 256), AdamW, on neuron:0. Each round times
``--steps`` training steps plain, then the same number inside ``torch_neuronx.readiness()``
(alternating which goes first); the table shows medians over rounds and the median of the
paired per-round ratios, in wall time and in process CPU time (all threads: the autograd
thread too); on a shared machine the CPU-time ratio is the meaningful one. Starting a recording (a scan
for tensors that already exist) and building the report (estimates, pictures) happen once
per run and are timed separately.

    python benchmarks/readiness.py            # ~2-4 min on a busy 2-core machine
    python benchmarks/readiness.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (autoloads torch_neuronx)

import torch_neuronx  # noqa: E402


def _model(layers: int, d: int, heads: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=layers,
        n_embd=d,
        n_head=heads,
        n_positions=seq,
        vocab_size=8192,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).to("neuron")


def _steps(model, opt, batch, n: int) -> tuple:
    """(wall, process CPU) seconds per step."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()  # wait for the step (the simulator is synchronous, a real device is not)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 layers, d=256, 2 rounds")
    a = ap.parse_args()
    if a.quick:
        a.layers, a.d, a.heads, a.seq, a.rounds = 2, 256, 4, 128, 2

    model = _model(a.layers, a.d, a.heads, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 8192, (a.batch, a.seq), device="neuron")
    _steps(model, opt, batch, 1)  # warm-up: optimizer state, allocator cache

    ratios = {"wall": [], "cpu": []}
    plain, recorded, report_s = {"wall": [], "cpu": []}, {"wall": [], "cpu": []}, []
    for i in range(a.rounds):
        order = ("plain", "readiness") if i % 2 == 0 else ("readiness", "plain")
        got = {}
        for kind in order:
            if kind == "plain":
                got[kind] = _steps(model, opt, batch, a.steps)
            else:
                t0 = time.perf_counter()
                with torch_neuronx.readiness() as ctx:
                    t1 = time.perf_counter()
                    got[kind] = _steps(model, opt, batch, a.steps)
                    t2 = time.perf_counter()
                ctx.report.pictures()
                report_s.append((t1 - t0) + (time.perf_counter() - t2))
        for j, k in enumerate(("wall", "cpu")):
            plain[k].append(got["plain"][j])
            recorded[k].append(got["readiness"][j])
            ratios[k].append(got["readiness"][j] / got["plain"][j])

    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"GPT-2 {a.layers} layers, d={a.d}, {params:.1f}M params, batch {a.batch} x seq {a.seq}, AdamW; "
        f"{a.rounds} rounds x {a.steps} steps; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    med = statistics.median
    print(f"{'':<34}{'wall s/step':>12}{'CPU s/step':>12}")
    print(f"{'plain eager on neuron':<34}{med(plain['wall']):>12.4f}{med(plain['cpu']):>12.4f}")
    print(f"{'under torch_neuronx.readiness()':<34}{med(recorded['wall']):>12.4f}{med(recorded['cpu']):>12.4f}")
    print(
        f"{'overhead (median paired ratio)':<34}{med(ratios['wall']):>11.3f}x{med(ratios['cpu']):>11.3f}x"
        "   (target <= 1.3x)"
    )
    print(f"{'start + report, once per run':<34}{statistics.median(report_s):>13.3f}s")
    for line in ctx.report.summary().splitlines():
        if line.strip().startswith("est."):
            print(line.strip())


if __name__ == "__main__":
    main()
