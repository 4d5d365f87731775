"""The readiness time estimate against AWS's published Trainium training and inference figures.

    python benchmarks/published.py                   # record every configuration, print the table
    python benchmarks/published.py --rows bert       # one row (bert, bert2, llama70b, llama_405b_ttft, ...: --help)
    python benchmarks/published.py --save DIR        # also write each recording as JSON

Each row reproduces one published configuration at its real size and runs it through the
readiness time model (torch_neuronx/readiness/estimate/, with the hardware table in
neuronsim/hardware.py); nothing here is fitted to the published figure. A row is a dict:

- ``figure``: what AWS published; ``configuration``: the run; ``unit``: of the two numbers;
- ``kind``, ``chip``, ``tp``: the kind of run (training, prefill, decode), the chip and the
  tensor-parallel degree, by which the report's error bands group the rows;
- ``aws``: AWS's figure; ``estimate``: ours; ``ratio``: estimate / aws, in the figure's unit (a
  throughput above 1 or a time below 1: too optimistic); the table's time error is the estimated
  time over AWS's measured time, minus one;
- ``mfu``: the model FLOPs utilisation AWS's figure implies (the matmul FLOPs of the recorded
  step over AWS's time for it at the dense BF16 peak of every core it used).

Sources: AWS Neuron documentation, "Hugging Face BERT Pretraining Tutorial (Data-Parallel)"
(phase 1: BertForPreTraining, vocabulary 30522, micro-batch 16, sequence 128, 32 gradient
accumulation micro-steps, gradients all-reduced once before the optimizer step, AdamW, BF16
autocast; phase 2: 16 nodes, micro-batch 2, sequence 512, LAMB, 512 MiB all-reduce buckets) and
NeuronX Distributed's Llama-3.1-70B pre-training script
(examples/training/llama/tp_pp_llama_hf_pretrain/run_llama3_70B_tp_pp.sh: TP=32 with sequence
parallelism, PP=8, 32 nodes so DP=4, sequence 8192, global batch 1024 split into 256
micro-batches of one sequence per replica, ZeRO-1, selective checkpointing, flash attention,
fused QKV, KV heads replicated 4x), reproduced by examples/llama_3d.py (PyTorch's own APIs: DTensor
tensor and sequence parallelism, torch.distributed.pipelining's 1F1B, FSDP2 instead of ZeRO-1);
the figures are those of the Neuron performance pages (trn1, Neuron 2.13-2.15 for BERT).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys

import published_inference  # this directory is the script's: on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _row(figure, configuration, aws, estimate, unit, flops_per_step, aws_step_seconds, cores, tp) -> dict:
    from neuronsim import hardware as hw

    peak = hw.CHIPS["trn1"].tensor_flops["bfloat16"]
    return {
        "figure": figure,
        "configuration": configuration,
        "kind": "training",
        "chip": "trn1",
        "tp": tp,
        "aws": aws,
        "estimate": estimate,
        "unit": unit,
        "ratio": estimate / aws,
        "mfu": flops_per_step / (aws_step_seconds * cores * peak),
    }


# -- BERT-Large phase 1, DP=32 on one trn1.32xlarge -------------------------------------
BERT = dict(ranks=32, micro_batch=16, seq=128, accumulation=32, vocab=30522, aws=3826.6)
BERT_BUCKET_BYTES = 25 << 20  # DDP's default bucket (bucket_cap_mb=25)


def record_bert() -> list:
    """One rank of the 32 (data-parallel ranks do the same work), a dry run at full size with
    the forward and backward compiled with backend "neuron": a first optimizer step of two
    micro-batches (it compiles and builds AdamW's state), then one whose first micro-batch,
    second (accumulating) micro-batch, and gradient all-reduce with AdamW step are recorded
    apart (each in its own region of the recording), for `bert_row` to compose the 32
    micro-batch step from."""
    import torch
    import torch.distributed as dist

    import torch_neuronx

    c = BERT
    with torch_neuronx.readiness(dry_run=True, instance="trn1.32xlarge") as r:
        dist.init_process_group("neuron", rank=0, world_size=c["ranks"], store=dist.HashStore())
        _bert_steps(c, lambda model: torch.optim.AdamW(model.parameters(), lr=4e-4), BERT_BUCKET_BYTES)
        dist.destroy_process_group()
    return [r.recording.for_estimate()]


def _bert_steps(c: dict, make_optimizer, bucket_bytes: int) -> None:
    """BERT-Large pre-training of configuration `c` on this rank, two optimizer steps of two
    micro-batches each, the second's first micro-batch, accumulating micro-batch and all-reduce
    with optimizer step each in a region (the first step compiles and builds the optimizer's state)."""
    import torch
    from transformers import BertConfig, BertForPreTraining

    from torch_neuronx.readiness import region

    cfg = BertConfig(
        vocab_size=c["vocab"],
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
    )
    model = BertForPreTraining(cfg).to("neuron")
    opt = make_optimizer(model)
    # AWS's run is compiled whole by XLA and neuronx-cc: the forward and backward are
    # compiled graphs here too, so the estimate gives them the compiled-graph fusion
    step = torch.compile(model, backend="neuron")
    for warm in (True, False):
        for name in ("first micro-batch", "accumulating micro-batch"):
            with region(name if not warm else "warm-up"):
                ids = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq"]), device="neuron")
                nsp = torch.zeros(c["micro_batch"], dtype=torch.long, device="neuron")
                kwargs = dict(token_type_ids=torch.zeros_like(ids), attention_mask=torch.ones_like(ids))
                with torch.autocast("neuron", dtype=torch.bfloat16):
                    out = step(input_ids=ids, labels=ids, next_sentence_label=nsp, **kwargs)
                (out.loss / c["accumulation"]).backward()
        with region("all-reduce and optimizer step" if not warm else "warm-up"):
            grads = [p.grad for p in reversed(list(model.parameters())) if p.grad is not None]
            _all_reduce_buckets(grads, bucket_bytes)
            opt.step()
        opt.zero_grad()


def _all_reduce_buckets(grads: list, bucket_bytes: int = BERT_BUCKET_BYTES) -> None:
    """What AWS's tutorial does with gradients once per optimizer step, after the last
    micro-batch's backward (flatten into DDP-sized buckets, all-reduce each, copy back), so the
    recording has the all-reduce in a region of its own; a script wrapped in DDP instead
    overlaps it with the last backward, which a dry run records as such."""
    import torch
    import torch.distributed as dist

    bucket: list = []

    def flush():
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))
        bucket.clear()

    for g in grads:
        bucket.append(g)
        if sum(x.nbytes for x in bucket) >= bucket_bytes:
            flush()
    if bucket:
        flush()


def _region(model, rec, name: str) -> tuple:
    """(estimated seconds, matmul FLOPs) of the region `name` of a recording."""
    est = model.bucket(rec, rec.region(name))
    return est.seconds, sum(est.tensor_flops.values())


def _bert_step(recs: list, c: dict) -> tuple:
    """(seconds, matmul FLOPs) of one rank's optimizer step of `c`: the first micro-batch, the
    accumulating ones like the recorded second, and the all-reduce with the optimizer step."""
    from torch_neuronx.readiness import TimeModel

    rec = recs[0]
    model = TimeModel("trn1", 1, "trn1.32xlarge", rec.fp32_precision)
    regions = ("first micro-batch", "accumulating micro-batch", "all-reduce and optimizer step")
    (t1, f1), (t2, f2), (t3, f3) = (_region(model, rec, name) for name in regions)
    n = c["accumulation"]
    return t1 + (n - 1) * t2 + t3, f1 + (n - 1) * f2 + f3


def _bert_row(recs: list, c: dict, figure: str, configuration: str) -> dict:
    seconds, flops = _bert_step(recs, c)
    seqs = c["ranks"] * c["micro_batch"] * c["accumulation"]
    return _row(
        figure, configuration, c["aws"], seqs / seconds, "seq/s", flops * c["ranks"], seqs / c["aws"], c["ranks"], 1
    )


def bert_row(recs: list) -> dict:
    """BERT-Large phase 1 row from its recording: the optimizer step is the first micro-batch,
    31 accumulating ones like the recorded second, and the all-reduce with AdamW."""
    return _bert_row(
        recs,
        BERT,
        "BERT-Large phase-1 pre-training throughput",
        "trn1.32xlarge, DP=32, micro-batch 16 x 32 accumulation steps, seq 128, BF16 autocast, AdamW",
    )


# -- BERT-Large phase 2, DP=512 on 16 trn1.32xlarge ---------------------------------------
# AWS's table: 16 nodes of 32 data-parallel ranks, micro-batch 2, sequence 512, global batch
# 524,288 (512 accumulation micro-steps per rank), BF16 + stochastic rounding, LAMB.
BERT2 = dict(ranks=512, per_instance=32, micro_batch=2, seq=512, accumulation=512, vocab=30522, aws=7507.0)
BERT2_BUCKET_BYTES = 512 << 20  # BUCKET_CAP_MB=512, as AWS's multi-node phase-2 script sets it


def record_bert2() -> list:
    """Rank 0 of the 512 (data-parallel ranks do the same work), in a child process whose
    simulator is a trn1.32xlarge: a dry run at full size as rank 0 of 512
    (``readiness(dry_run=True, rank=0, world_size=512)``: the rank's torchrun environment, 32
    ranks per instance, so the gradient all-reduce's group spans 16 instances), the steps of
    `record_bert` with phase 2's configuration, LAMB (benchmarks/_lamb.py, the NVLAMB of AWS's
    tutorial) and AWS's 512 MiB all-reduce buckets."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bert2.json")
        env = dict(os.environ, TORCH_NEURONX_INSTANCE_TYPE="trn1.32xlarge", HF_HUB_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(HERE), env.get("PYTHONPATH")) if p)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--_record", "bert2", out], env=env, check=True)
        return load(out)


def _record_bert2(out: str) -> None:
    import time

    import torch.distributed as dist
    from _lamb import Lamb, bert_param_groups

    import torch_neuronx

    c = BERT2
    t0 = time.perf_counter()
    with torch_neuronx.readiness(dry_run=True, instance="trn1.32xlarge", rank=0, world_size=c["ranks"]) as r:
        dist.init_process_group("neuron")  # rank 0 of 512, from the environment readiness gives the rank
        if (dist.get_world_size(), os.environ.get("LOCAL_WORLD_SIZE")) != (c["ranks"], str(c["per_instance"])):
            raise RuntimeError(
                f"expected rank 0 of {c['ranks']} with {c['per_instance']} per instance, got world size "
                f"{dist.get_world_size()} and LOCAL_WORLD_SIZE={os.environ.get('LOCAL_WORLD_SIZE')}"
            )
        _bert_steps(c, lambda model: Lamb(bert_param_groups(model), lr=4e-3), BERT2_BUCKET_BYTES)
    rec = r.recording.for_estimate()
    rec.extra.update(wall_seconds=round(time.perf_counter() - t0, 1))
    with open(out, "w") as f:
        f.write("[" + rec.to_json() + "]")


def bert2_row(recs: list) -> dict:
    """BERT-Large phase 2 row from its recording: the optimizer step is the first micro-batch,
    511 accumulating ones like the recorded second, and the all-reduce across the 16 instances
    with LAMB."""
    return _bert_row(
        recs,
        BERT2,
        "BERT-Large phase-2 pre-training throughput",
        "16 x trn1.32xlarge, DP=512, micro-batch 2 x 512 accumulation steps, seq 512, BF16 autocast, LAMB",
    )


# -- Llama-3.1-70B pre-training, TP=32 x PP=8 x DP=4 on 32 trn1.32xlarge --------------------
LLAMA_RUN = dict(tp=32, pp=8, dp=4, seq=8192, global_batch=1024, aws=7.94)
# examples/llama_3d.py's defaults are AWS's layout and batch; AWS's run checkpoints selectively
LLAMA_SCRIPT = ["--config", "llama-3.1-70b", "--steps", "1", "--checkpointing", "selective"]


def record_llama() -> list:
    """examples/llama_3d.py in AWS's layout, dry-run whole as a user runs it (``torch-neuronx check
    --dry-run -- torchrun --nnodes 32 --nproc-per-node 32 ...``: the 1,024 ranks by rank classes):
    the recording of each class's representative, with its class's size in ``extra``."""
    import subprocess
    import tempfile

    from torch_neuronx.readiness import Recording

    run = LLAMA_RUN
    nodes, per_node = run["pp"] * run["dp"], run["tp"]  # tp fills a trn1.32xlarge's 32 cores
    script = os.path.join(os.path.dirname(HERE), "examples", "llama_3d.py")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "report")
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", "trn1.32xlarge"]
        cmd += ["--out", out, "--", "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node), script]
        subprocess.run(cmd + LLAMA_SCRIPT, env=dict(os.environ, HF_HUB_OFFLINE="1"), check=True)
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
        recs = []
        for c in report["classes"]["classes"]:
            with open(os.path.join(out, "recordings", f"rank{c['rep']}.json")) as f:
                rec = Recording.from_json(f.read()).for_estimate()
            rec.extra.update(class_size=c["size"])
            recs.append(rec)
    return recs


def llama_row(recs: list) -> dict:
    """Llama-3.1-70B pre-training row from its classes' recordings: the step time the dry run's
    report gives (the slowest rank's, on the 1F1B schedule's critical path), and the whole job's
    matmul FLOPs (each class's representative's, times the class's size)."""
    from torch_neuronx.readiness import TimeModel

    run = LLAMA_RUN
    model = TimeModel("trn1", 1, "trn1.32xlarge", recs[0].fp32_precision)
    step = model.estimate(recs).step_seconds
    flops = sum(r.extra["class_size"] * sum(model.estimate([r]).tensor_flops.values()) for r in recs)
    ranks, covered = run["tp"] * run["pp"] * run["dp"], sum(r.extra["class_size"] for r in recs)
    if covered != ranks:
        raise ValueError(f"the classes' recordings cover {covered} of {ranks} ranks")
    return _row(
        "Llama-3.1-70B pre-training throughput",
        "32 x trn1.32xlarge, TP=32 x PP=8 x DP=4, seq 8192, global batch 1024 (256 micro-batches of 1), "
        "BF16 parameters, FSDP2 with fp32 master weights and AdamW, selective activation checkpointing, eager "
        "(AWS: NxD, compiled; estimate: examples/llama_3d.py, all 1,024 ranks by rank classes in a dry run)",
        run["aws"],
        run["global_batch"] / step,
        "seq/s",
        flops,
        run["global_batch"] / run["aws"],
        ranks,
        run["tp"],
    )


# -- the table --------------------------------------------------------------------------------
def _save(directory: str | None, name: str, recs: list) -> None:
    if directory:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{name}.json"), "w") as f:
            f.write("[" + ",\n".join(r.to_json() for r in recs) + "]")


def load(path) -> list:
    """The recordings `--save` wrote to `path` (gzip-compressed if it ends in .gz)."""
    import gzip

    from torch_neuronx.readiness import Recording

    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
        return [Recording.from_json(d) for d in json.load(f)]


def bert(save: str | None = None) -> dict:
    raws = record_bert()
    _save(save, "bert", raws)
    return bert_row(raws)


def bert2(save: str | None = None) -> dict:
    raws = record_bert2()
    _save(save, "bert2", raws)
    return bert2_row(raws)


def llama70b(save: str | None = None) -> dict:
    raws = record_llama()
    _save(save, "llama70b", raws)
    return llama_row(raws)


# Each entry returns one row dict: the training rows here, the inference rows (one shared dry
# run of Llama-3.1-405B's generate) from published_inference.py.
ROWS = [bert, bert2, llama70b, *published_inference.ROWS]


# What the rows are held to: estimated time within 10% of AWS's measured (the tests pin the rows'
# values, not the band; reports print each kind's error from torch_neuronx.readiness's table).
TARGET = 0.10


def _published(r: dict):
    from torch_neuronx.readiness.estimate import known_error

    return known_error.PublishedRow(r["figure"], r["kind"], r["chip"], r["aws"], r["estimate"], r["unit"], r["tp"])


def to_markdown(rows: list) -> str:
    """The table, its mean absolute error and the leave-one-out check, in Markdown."""
    from torch_neuronx.readiness.estimate import known_error

    published = [_published(r) for r in rows]
    lines = [
        f"| configuration | AWS | estimate | ratio | time error | implied MFU | within {TARGET:.0%} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, p in zip(rows, published):
        met = "yes" if abs(p.time_error) <= TARGET else "no"
        mfu = "-" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%"
        lines.append(
            f"| {r['figure']}: {r['configuration']} | {r['aws']:,.2f} {r['unit']} | {r['estimate']:,.2f} {r['unit']} "
            f"| {r['ratio']:.2f} | {p.time_error:+.1%} | {mfu} | {met} |"
        )
    within = sum(abs(p.time_error) <= TARGET for p in published)
    mae = known_error.mean_absolute_error(published)
    lines += [
        "",
        f"Mean absolute error of the estimated time {mae:.1%}; {within} of {len(rows)} rows within {TARGET:.0%}.",
    ]
    lines += ["", "Leave one out (the band the other rows of a row's kind give it):", ""]
    for p, span, inside in known_error.leave_one_out(tuple(published)):
        if span is None:
            lines.append(f"- {p.name}: no other row of its kind")
        else:
            where = "inside" if inside else "outside"
            lines.append(f"- {p.name}: {span[0]:+.1%} to {span[1]:+.1%}; its own {p.time_error:+.1%} is {where}")
    return "\n".join(lines)


def main(argv=None) -> None:
    by_name = {f.__name__: f for f in ROWS}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(by_name), help=f"comma-separated, of: {', '.join(by_name)}")
    p.add_argument("--save", help="directory to write each configuration's recording to (JSON)")
    p.add_argument("--_record", nargs=2, help=argparse.SUPPRESS)  # in a child process: NAME OUT
    args = p.parse_args(argv)
    if args._record:
        {"bert2": _record_bert2}[args._record[0]](args._record[1])
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    wanted = args.rows.split(",")
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        p.error(f"unknown row(s) {unknown}; choose from {', '.join(by_name)}")
    rows = []
    for name in wanted:
        f = by_name[name]
        rows.append(f(save=args.save) if "save" in inspect.signature(f).parameters else f())
    print(to_markdown(rows))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
