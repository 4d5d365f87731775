"""The readiness estimate against AWS's published inference figure: Llama-3.1-405B on trn2.48xlarge.

    python benchmarks/published_inference.py                 # dry-runs the model (minutes), prints the rows
    python benchmarks/published_inference.py --raw R.json    # the rows from a saved recording (instant)
    python benchmarks/published_inference.py --save-raw R.json
    python benchmarks/published_inference.py --compiled        # the same, the forward compiled

AWS publishes (NxD Inference + vLLM, trn2.48xlarge, TP=64 at LNC=2, BF16, batch 1, 10,000 input /
1,500 output tokens) a time to first token of 2,442 ms and a time per output token of 37.9 ms for
Llama-3.1-405B. This script writes the public Llama-3.1-405B config and a header-only checkpoint,
then runs ``from_pretrained(..., DistributedConfig(tp_plan=...))`` and ``generate`` at real size
in a dry run under ``torch_neuronx.readiness`` on trn2.48xlarge: batch 1, the prompt padded to
its bucket (below), a static KV cache (as NxD Inference keeps one), a few output tokens (enough
for a median decode step). Eager (``disable_compile``), or with ``--compiled`` the model's
forward compiled with backend neuron, as NxD Inference compiles context encoding and token
generation (each call of the compiled forward is a phase, its graph costed whole).

Four choices, all as NxD Inference runs the model in AWS's command (the Llama-3.1-405B tutorial:
``--sequence-parallel-enabled``, ``--context-encoding-buckets 2048 4096 10240 12288``):

- One rank of the world of 64 is recorded (rank 0, PyTorch's fake process group through the
  ``neuron`` backend): under tensor parallelism every rank runs the same ops on shards of the same
  shape, so rank 0 stands for all 64 (the estimate is of the slowest rank anyway).
- The 8 KV heads are replicated to the TP degree (8 copies each: 64 KV heads, one per rank), NxD
  Inference's GQA sharding when TP exceeds the KV heads; transformers' colwise plan cannot split 8
  heads over 64 ranks otherwise. Each rank holds and reads exactly one KV head, as on the device.
- The prompt is 10,240 tokens: NxD Inference pads the 10,000-token prompt to its 10,240-token
  context-encoding bucket, and its prefill computes over the whole bucket.
- The prefill runs sequence-parallel (``_sequence_parallel.PLAN`` added to Llama's plan): RMSNorms
  and residual adds on each rank's 160 rows, an all-gather before attention and the MLP and a
  reduce-scatter after them in place of the all-reduce. Decoding runs without it, as NxD Inference's
  token generation does.

``ROWS`` is a list of functions each returning one row (figure, configuration, aws, estimate,
unit, ratio, mfu); they share one recording.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time

import _llama  # this directory is the script's: on sys.path
import _sequence_parallel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTANCE, LNC, TP = "trn2.48xlarge", 2, 64
BUCKET = 10_240  # NxD Inference's context-encoding bucket for the 10,000-token prompt
NEW_TOKENS = 4  # 3 decode steps after the prefill: a median of 3
CONFIGURATION = (
    "trn2.48xlarge, TP=64 at LNC=2, BF16, batch 1, 10,000-token prompt (AWS: NxD Inference + vLLM, "
    "1,500 output tokens; estimate: transformers generate of the prompt padded to NxD Inference's "
    "10,240-token bucket, sequence-parallel prefill, static KV cache, rank 0 of 64 in a dry run)"
)
COMPILED = "; the model's forward compiled (backend neuron): context encoding and token generation each one graph"

# Public config of meta-llama/Llama-3.1-405B (config.json), KV heads replicated to TP=64 (see above).
LLAMA_405B = _llama.config("405b")
KV_REPLICATION = TP // LLAMA_405B["num_key_value_heads"]

# AWS's figures (TRAINIUM_PERF.md: Neuron documentation, NxD Inference + vLLM on trn2.48xlarge).
AWS_TTFT_MS = 2442.0
AWS_TPOT_MS = 37.9


def _record(out: str, layers: int | None, compiled: bool = False) -> None:
    """In a fresh process: the dry run of rank 0 of 64, its recording written to `out`."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.distributed import DistributedConfig

    import torch_neuronx
    from torch_neuronx.readiness import header_only_checkpoint

    cfg = dict(LLAMA_405B, num_key_value_heads=LLAMA_405B["num_key_value_heads"] * KV_REPLICATION)
    if layers:
        cfg["num_hidden_layers"] = layers
    with tempfile.TemporaryDirectory() as path:
        header_only_checkpoint(LlamaConfig(**cfg), path)
        t0 = time.perf_counter()
        r = torch_neuronx.readiness(dry_run=True, instance=INSTANCE, lnc=LNC)
        with r:
            dist.init_process_group("neuron", store=FakeStore(), rank=0, world_size=TP)
            _sequence_parallel.register()
            model = AutoModelForCausalLM.from_pretrained(
                path, distributed_config=DistributedConfig(tp_plan=_sequence_parallel.PLAN), dtype=torch.bfloat16
            ).eval()
            if compiled:  # context encoding and token generation each one compiled graph, as NxD Inference
                model.forward = torch.compile(model.forward, backend="neuron", dynamic=False)
            ids = torch.ones(1, BUCKET, dtype=torch.long, device="neuron")
            with torch.no_grad():
                model.generate(
                    ids,
                    max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    cache_implementation="static",
                    disable_compile=True,
                    pad_token_id=0,
                )
        wall = time.perf_counter() - t0
    rec = r.recording.for_estimate()
    rec.extra.update(wall_seconds=round(wall, 1), verdict=r.report.verdict, layers=cfg["num_hidden_layers"])
    with open(out, "w") as f:
        f.write(rec.to_json())


@functools.lru_cache(maxsize=None)
def recording(path: str | None = None, layers: int | None = None, compiled: bool = False):
    """The saved recording at `path`, or a new dry run in a child process (its own simulator:
    trn2.48xlarge, rank 0 of 64)."""
    from torch_neuronx.readiness import Recording

    if path:
        with open(path) as f:
            return Recording.from_json(f.read())
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "raw.json")
        env = dict(os.environ, TORCH_NEURONX_INSTANCE_TYPE=INSTANCE, NEURON_LOGICAL_NC_CONFIG=str(LNC))
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(TP), HF_HUB_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, os.path.abspath(__file__), "--_record", out] + (
            ["--layers", str(layers)] if layers else []
        )
        cmd += ["--compiled"] if compiled else []
        subprocess.run(cmd, env=env, check=True)
        with open(out) as f:
            return Recording.from_json(f.read())


def phases(rec):
    """The prefill and decode estimates of the recording on trn2.48xlarge at LNC=2."""
    from torch_neuronx.readiness import TimeModel

    est = TimeModel("trn2", LNC, INSTANCE, rec.fp32_precision).estimate([rec])
    if est.phases is None or est.phases.missing:
        raise RuntimeError(f"the recording has no generation phases: {est.phases}")
    return est.phases


def _row(figure: str, phase: str, aws_ms: float, raw=None, compiled: bool = False) -> dict:
    p = getattr(phases(raw if raw is not None else recording(compiled=compiled)), phase)
    ms = p.seconds * 1e3
    return {
        "figure": figure,
        "configuration": CONFIGURATION[:-1] + (COMPILED + ")" if compiled else ")"),
        "kind": phase,
        "chip": "trn2",
        "tp": TP,
        "aws": aws_ms,
        "estimate": round(ms, 1),
        "unit": "ms",
        "ratio": round(ms / aws_ms, 3),
        # the MFU AWS's figure implies (the training rows' meaning): the same FLOPs in AWS's time
        "mfu": None if p.mfu is None else p.mfu * ms / aws_ms,
        "dominant": p.dominant,
        "shares": {k: round(v, 3) for k, v in p.term_shares.items()},
    }


def llama_405b_ttft(raw=None) -> dict:
    """Llama-3.1-405B time to first token: the estimated prefill of a 10,000-token prompt."""
    return _row("Llama-3.1-405B inference: time to first token", "prefill", AWS_TTFT_MS, raw)


def llama_405b_tpot(raw=None) -> dict:
    """Llama-3.1-405B time per output token: the estimated median decode step."""
    return _row("Llama-3.1-405B inference: time per output token", "decode", AWS_TPOT_MS, raw)


def llama_405b_ttft_compiled(raw=None) -> dict:
    """The time to first token with the model's forward compiled, as NxD Inference runs it."""
    return _row("Llama-3.1-405B inference: time to first token, compiled", "prefill", AWS_TTFT_MS, raw, True)


def llama_405b_tpot_compiled(raw=None) -> dict:
    """The time per output token from the compiled token-generation graph, as NxD Inference runs it."""
    return _row("Llama-3.1-405B inference: time per output token, compiled", "decode", AWS_TPOT_MS, raw, True)


EAGER_ROWS = [llama_405b_ttft, llama_405b_tpot]
COMPILED_ROWS = [llama_405b_ttft_compiled, llama_405b_tpot_compiled]
ROWS = EAGER_ROWS + COMPILED_ROWS  # each pair shares one recording (two dry runs in all)


def markdown(rows: list) -> str:
    lines = [
        "| figure | configuration | AWS | estimate | ratio | implied MFU | dominated by |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        lines.append(
            f"| {r['figure']} | {r['configuration']} | {r['aws']:g} {r['unit']} | {r['estimate']:g} {r['unit']} "
            f"| {r['ratio']:.2f} | {mfu} | {r['dominant']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--raw", help="compute the rows from this saved recording instead of a new dry run (with --compiled: of one)"
    )
    ap.add_argument("--save-raw", help="write the recording here")
    ap.add_argument("--layers", type=int, help="fewer decoder layers (a quick check of the pipeline)")
    ap.add_argument("--compiled", action="store_true", help="compile the model's forward (backend neuron)")
    ap.add_argument("--_record", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._record:
        _record(a._record, a.layers, a.compiled)
        return
    raw = recording(a.raw, a.layers, a.compiled)
    if a.save_raw:
        with open(a.save_raw, "w") as f:
            f.write(raw.to_json())
    x = raw.extra
    print(f"dry run: {x.get('wall_seconds')} s wall, {x.get('layers')} layers, verdict: {x.get('verdict')}")
    print(markdown([f(raw) for f in (COMPILED_ROWS if a.compiled else EAGER_ROWS)]))


if __name__ == "__main__":
    main()
