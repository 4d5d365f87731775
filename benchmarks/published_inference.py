"""The readiness estimate against AWS's published inference figures: Llama-3.1-405B on trn2.48xlarge,
Llama-3-70B and Llama-2-13b on trn1.32xlarge.

    python benchmarks/published_inference.py                 # dry-runs Llama-3.1-405B (minutes), prints the rows
    python benchmarks/published_inference.py --raw R.json    # the rows from a saved recording (instant)
    python benchmarks/published_inference.py --save-raw R.json
    python benchmarks/published_inference.py --compiled        # the same, the forward compiled
    python benchmarks/published_inference.py --run llama3_70b  # a trn1 run (compiled; its two recordings)

Each run writes the model's public config and a header-only checkpoint, then runs
``from_pretrained(..., DistributedConfig(tp_plan=...))`` and ``generate`` at real size in a dry
run under ``torch_neuronx.readiness`` on the run's instance, as rank 0 of its tensor-parallel
group (PyTorch's fake process group through the ``neuron`` backend): under tensor parallelism
every rank runs the same ops on shards of the same shape, so rank 0 stands for all (the estimate
is of the slowest rank anyway). A static KV cache (as NxD Inference and transformers-neuronx keep
one), a few output tokens (enough for a median decode step). Eager (``disable_compile``), or
compiled: the model's forward compiled with backend neuron, as both frameworks compile context
encoding and token generation (each call of the compiled forward is a phase, its graph costed
whole).

Llama-3.1-405B (AWS: NxD Inference + vLLM, trn2.48xlarge, TP=64 at LNC=2, BF16, batch 1, 10,000
input / 1,500 output tokens: a time to first token of 2,442 ms and a time per output token of
37.9 ms), as AWS's command runs it (the Llama-3.1-405B tutorial: ``--sequence-parallel-enabled``,
``--context-encoding-buckets 2048 4096 10240 12288``):

- The 8 KV heads are replicated to the TP degree (8 copies each: 64 KV heads, one per rank), NxD
  Inference's GQA sharding when TP exceeds the KV heads; transformers' colwise plan cannot split 8
  heads over 64 ranks otherwise. Each rank holds and reads exactly one KV head, as on the device.
- The prompt is 10,240 tokens: NxD Inference pads the 10,000-token prompt to its 10,240-token
  context-encoding bucket, and its prefill computes over the whole bucket.
- The prefill runs sequence-parallel (``_sequence_parallel.PLAN`` added to Llama's plan): RMSNorms
  and residual adds on each rank's 160 rows, an all-gather before attention and the MLP and a
  reduce-scatter after them in place of the all-reduce. Decoding runs without it, as NxD Inference's
  token generation does.
- One recording gives both phases (eager and compiled: two recordings in all).

Llama-3-70B (batch 1, 2,048 input / 2,048 output tokens: 547 ms and 26.2 ms p50) and Llama-2-13b
(batch 8, 4,096 / 4,096: 6,668.7 ms and 19.86 ms p50), both on trn1.32xlarge (32 NeuronCore-v2,
TP=32) with transformers-neuronx (Neuron 2.18: an FP16 model with BF16 matmuls and bf16 weights),
as transformers-neuronx runs them with ``n_positions`` the input plus output length (4,096 and
8,192):

- Compiled only: transformers-neuronx runs context encoding and token generation as compiled
  graphs, nothing eagerly. Weights and activations bf16 (the weights are stored bf16 and the
  matmuls run in bf16 in AWS's runs; FP16 activations would move the same bytes).
- Heads as transformers-neuronx shards them: Llama-3-70B's 8 KV heads replicated to 32 (one per
  rank beside its 2 query heads); Llama-2-13b's 40 heads (multi-head attention) padded to 64,
  query, key and value alike (``round_up_to_divisor(40, 32)``), 2 per rank, head size 128, as its
  padding does: the padded heads are computed and cached like the others.
- The prompt is not padded: transformers-neuronx's context-encoding buckets are half its token
  buckets (powers of 2 from 128 to ``n_positions``), so the 2,048- and 4,096-token prompts fill
  their buckets exactly. No sequence parallelism (off by default in transformers-neuronx 2.18).
- Two recordings per run, one for each phase: transformers-neuronx's prefill attends over the
  prompt's bucket only, and every token-generation step after the prompt attends over (and reads
  the KV cache of) the ``n_positions`` bucket (its token buckets are powers of 2: positions 2,048
  to 4,095 use the 4,096 bucket). So the time to first token comes from a generate with the
  static cache sized by the prompt (transformers' default), and the time per output token from
  one whose static cache is ``n_positions`` long (``max_cache_len``), which its decode steps
  attend over whole, as the median step of AWS's run does.

``ROWS`` is a list of functions each returning one row (figure, configuration, aws, estimate,
unit, ratio, mfu); a run's rows share its recordings.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import _llama  # this directory is the script's: on sys.path
import _sequence_parallel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TOKENS = 4  # 3 decode steps after the prefill: a median of 3
COMPILED = "; the model's forward compiled (backend neuron): context encoding and token generation each one graph"


@dataclasses.dataclass(frozen=True)
class Run:
    """One published inference configuration, as the dry run reproduces it."""

    key: str
    config: dict  # LlamaConfig keyword arguments, heads as the framework shards them
    chip: str
    instance: str
    lnc: int
    tp: int
    batch: int
    prompt: int  # tokens of each sequence's prefill (AWS's prompt, padded to a bucket where the framework does)
    decode_cache: int | None  # static cache length of the decode rows' own recording; None: one recording for both
    sequence_parallel: bool
    aws_ttft_ms: float
    aws_tpot_ms: float
    configuration: str


# -- Llama-3.1-405B on trn2.48xlarge (NxD Inference + vLLM) --------------------------------------
INSTANCE, LNC, TP = "trn2.48xlarge", 2, 64
BUCKET = 10_240  # NxD Inference's context-encoding bucket for the 10,000-token prompt
CONFIGURATION = (
    "trn2.48xlarge, TP=64 at LNC=2, BF16, batch 1, 10,000-token prompt (AWS: NxD Inference + vLLM, "
    "1,500 output tokens; estimate: transformers generate of the prompt padded to NxD Inference's "
    "10,240-token bucket, sequence-parallel prefill, static KV cache, rank 0 of 64 in a dry run)"
)
# Public config of meta-llama/Llama-3.1-405B (config.json), KV heads replicated to TP=64 (see above).
LLAMA_405B = _llama.config("405b")
KV_REPLICATION = TP // LLAMA_405B["num_key_value_heads"]
# AWS's figures (TRAINIUM_PERF.md: Neuron documentation, NxD Inference + vLLM on trn2.48xlarge).
AWS_TTFT_MS = 2442.0
AWS_TPOT_MS = 37.9

# -- Llama-3-70B and Llama-2-13b on trn1.32xlarge (transformers-neuronx, Neuron 2.18) ---------------
# Public config of meta-llama/Meta-Llama-3-70B: Llama-3.1-70B's without the llama3 RoPE scaling
# and with 8,192 positions; its 8 KV heads replicated to TP=32.
LLAMA3_70B = dict(_llama.config("70b"), rope_scaling=None, max_position_embeddings=8192)
# Public config of meta-llama/Llama-2-13b-hf (multi-head attention: 40 KV heads), with the
# 40 heads padded to 64 of size 128 as transformers-neuronx pads them for TP=32, and
# transformers-neuronx's n_positions of AWS's run (8,192) as the positions.
LLAMA2_13B = dict(
    hidden_size=5120,
    intermediate_size=13824,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=40,
    vocab_size=32000,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
TRN1 = "trn1.32xlarge, TP=32 (32 NeuronCore-v2 at LNC=1)"


def _trn1_configuration(batch: int, prompt: int, out: int) -> str:
    return (
        f"{TRN1}, batch {batch}, {prompt:,}-token prompt, {out:,} output tokens (AWS: transformers-neuronx, "
        f"FP16 model with BF16 matmuls, n_positions {prompt + out:,}; estimate: transformers generate, "
        "BF16, heads sharded as transformers-neuronx shards them, static KV cache: the prompt's for the "
        f"prefill, n_positions for the decode steps, rank 0 of 32 in a dry run{COMPILED})"
    )


RUNS = {
    "llama405b": Run(
        key="llama405b",
        config=dict(LLAMA_405B, num_key_value_heads=LLAMA_405B["num_key_value_heads"] * KV_REPLICATION),
        chip="trn2",
        instance=INSTANCE,
        lnc=LNC,
        tp=TP,
        batch=1,
        prompt=BUCKET,
        decode_cache=None,
        sequence_parallel=True,
        aws_ttft_ms=AWS_TTFT_MS,
        aws_tpot_ms=AWS_TPOT_MS,
        configuration=CONFIGURATION,
    ),
    "llama3_70b": Run(
        key="llama3_70b",
        config=dict(LLAMA3_70B, num_key_value_heads=32),
        chip="trn1",
        instance="trn1.32xlarge",
        lnc=1,
        tp=32,
        batch=1,
        prompt=2048,
        decode_cache=4096,
        sequence_parallel=False,
        aws_ttft_ms=547.0,
        aws_tpot_ms=26.2,
        configuration=_trn1_configuration(1, 2048, 2048),
    ),
    "llama2_13b": Run(
        key="llama2_13b",
        config=dict(
            LLAMA2_13B, num_attention_heads=64, num_key_value_heads=64, head_dim=128, max_position_embeddings=8192
        ),
        chip="trn1",
        instance="trn1.32xlarge",
        lnc=1,
        tp=32,
        batch=8,
        prompt=4096,
        decode_cache=8192,
        sequence_parallel=False,
        aws_ttft_ms=6668.7,
        aws_tpot_ms=19.86,
        configuration=_trn1_configuration(8, 4096, 4096),
    ),
}


def _record(run: Run, out: str, layers: int | None, compiled: bool = False, cache: int | None = None) -> None:
    """In a fresh process: the dry run of rank 0 of the run's TP group, its recording written to
    `out`; `cache`: the static KV cache's length (default: the prompt and the new tokens)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.distributed import DistributedConfig

    import torch_neuronx
    from torch_neuronx.readiness import header_only_checkpoint

    cfg = dict(run.config)
    if layers:
        cfg["num_hidden_layers"] = layers
    with tempfile.TemporaryDirectory() as path:
        header_only_checkpoint(LlamaConfig(**cfg), path)
        t0 = time.perf_counter()
        r = torch_neuronx.readiness(dry_run=True, instance=run.instance, lnc=run.lnc)
        with r:
            dist.init_process_group("neuron", store=FakeStore(), rank=0, world_size=run.tp)
            if run.sequence_parallel:
                _sequence_parallel.register()
            plan = _sequence_parallel.PLAN if run.sequence_parallel else "auto"
            model = AutoModelForCausalLM.from_pretrained(
                path, distributed_config=DistributedConfig(tp_plan=plan), dtype=torch.bfloat16
            ).eval()
            if compiled:  # context encoding and token generation each one compiled graph, as the frameworks
                model.forward = torch.compile(model.forward, backend="neuron", dynamic=False)
            ids = torch.ones(run.batch, run.prompt, dtype=torch.long, device="neuron")
            with torch.no_grad():
                model.generate(
                    ids,
                    max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    cache_implementation="static",
                    max_cache_len=cache,
                    disable_compile=True,
                    pad_token_id=0,
                )
        wall = time.perf_counter() - t0
    rec = r.recording.for_estimate()
    rec.extra.update(
        wall_seconds=round(wall, 1), verdict=r.report.verdict, layers=cfg["num_hidden_layers"], run=run.key
    )
    if cache:
        rec.extra["cache"] = cache
    with open(out, "w") as f:
        f.write(rec.to_json())


def _load(path: str):
    """A saved recording, or the list of them a run with two recordings saves."""
    from torch_neuronx.readiness import Recording

    with open(path) as f:
        data = json.load(f)
    return [Recording.from_json(d) for d in data] if isinstance(data, list) else Recording.from_json(data)


@functools.lru_cache(maxsize=None)
def recording(
    path: str | None = None, layers: int | None = None, compiled: bool = False, run: str = "llama405b", cache=None
):
    """The saved recording at `path`, or a new dry run of `run` in a child process (its own
    simulator: the run's instance, rank 0 of its TP group)."""
    if path:
        return _load(path)
    r = RUNS[run]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "raw.json")
        env = dict(os.environ, TORCH_NEURONX_INSTANCE_TYPE=r.instance, NEURON_LOGICAL_NC_CONFIG=str(r.lnc))
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(r.tp), HF_HUB_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, os.path.abspath(__file__), "--_record", out, "--run", run]
        cmd += ["--layers", str(layers)] if layers else []
        cmd += ["--compiled"] if compiled else []
        cmd += ["--_cache", str(cache)] if cache else []
        subprocess.run(cmd, env=env, check=True)
        return _load(out)


def run_recordings(run: str, layers: int | None = None) -> list:
    """The trn1 runs' two compiled recordings: [the prefill's, the decode steps']."""
    r = RUNS[run]
    return [recording(None, layers, True, run), recording(None, layers, True, run, r.decode_cache)]


def _run_of(rec) -> Run:
    return RUNS[rec.extra.get("run", "llama405b")]


def phases(rec):
    """The prefill and decode estimates of the recording on its run's instance."""
    from torch_neuronx.readiness import TimeModel

    r = _run_of(rec)
    est = TimeModel(r.chip, r.lnc, r.instance, rec.fp32_precision).estimate([rec])
    if est.phases is None or est.phases.missing:
        raise RuntimeError(f"the recording has no generation phases: {est.phases}")
    return est.phases


def _row(figure: str, phase: str, aws_ms: float, raw=None, compiled: bool = False, run: str = "llama405b") -> dict:
    r = RUNS[run]
    if raw is None:
        raw = recording(compiled=compiled) if r.decode_cache is None else run_recordings(run)
    if isinstance(raw, list):  # a run with a recording per phase: [prefill's, decode steps']
        raw = raw[0] if phase == "prefill" else raw[-1]
    p = getattr(phases(raw), phase)
    ms = p.seconds * 1e3
    configuration = r.configuration
    if r.decode_cache is None:
        configuration = configuration[:-1] + (COMPILED + ")" if compiled else ")")
    return {
        "figure": figure,
        "configuration": configuration,
        "kind": phase,
        "chip": r.chip,
        "tp": r.tp,
        "aws": aws_ms,
        "estimate": round(ms, 2),
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


def llama3_70b_ttft(raw=None) -> dict:
    """Llama-3-70B time to first token on trn1.32xlarge: the compiled prefill of a 2,048-token prompt.
    `raw`: the run's two recordings (or the prefill's)."""
    r = RUNS["llama3_70b"]
    return _row("Llama-3-70B inference: time to first token", "prefill", r.aws_ttft_ms, raw, True, r.key)


def llama3_70b_tpot(raw=None) -> dict:
    """Llama-3-70B time per output token: the median compiled decode step over the 4,096-position cache."""
    r = RUNS["llama3_70b"]
    return _row("Llama-3-70B inference: time per output token", "decode", r.aws_tpot_ms, raw, True, r.key)


def llama2_13b_ttft(raw=None) -> dict:
    """Llama-2-13b time to first token on trn1.32xlarge: the compiled prefill of 8 prompts of 4,096 tokens."""
    r = RUNS["llama2_13b"]
    return _row("Llama-2-13b inference: time to first token", "prefill", r.aws_ttft_ms, raw, True, r.key)


def llama2_13b_tpot(raw=None) -> dict:
    """Llama-2-13b time per output token: the median compiled decode step of 8 sequences over the
    8,192-position cache."""
    r = RUNS["llama2_13b"]
    return _row("Llama-2-13b inference: time per output token", "decode", r.aws_tpot_ms, raw, True, r.key)


EAGER_ROWS = [llama_405b_ttft, llama_405b_tpot]
COMPILED_ROWS = [llama_405b_ttft_compiled, llama_405b_tpot_compiled]
TRN1_ROWS = {"llama3_70b": [llama3_70b_ttft, llama3_70b_tpot], "llama2_13b": [llama2_13b_ttft, llama2_13b_tpot]}
# each 405B pair shares one recording (two dry runs in all); each trn1 pair its run's two
ROWS = EAGER_ROWS + COMPILED_ROWS + [f for fs in TRN1_ROWS.values() for f in fs]


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
    ap.add_argument("--save-raw", help="write the recording here (a trn1 run: the list of its two)")
    ap.add_argument("--layers", type=int, help="fewer decoder layers (a quick check of the pipeline)")
    ap.add_argument("--compiled", action="store_true", help="compile the model's forward (backend neuron)")
    ap.add_argument("--run", default="llama405b", choices=sorted(RUNS), help="which published run (default: 405B)")
    ap.add_argument("--_record", help=argparse.SUPPRESS)
    ap.add_argument("--_cache", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._record:
        _record(RUNS[a.run], a._record, a.layers, a.compiled, a._cache)
        return
    if a.run == "llama405b":
        raw = recording(a.raw, a.layers, a.compiled)
        rows = COMPILED_ROWS if a.compiled else EAGER_ROWS
        raws = [raw]
    else:
        raws = raw = _load(a.raw) if a.raw else run_recordings(a.run, a.layers)
        rows = TRN1_ROWS[a.run]
    if a.save_raw:
        with open(a.save_raw, "w") as f:
            f.write(raw.to_json() if len(raws) == 1 else "[" + ",\n".join(x.to_json() for x in raws) + "]")
    for x in raws:
        e = x.extra
        print(
            f"dry run: {e.get('wall_seconds')} s wall, {e.get('layers')} layers, static cache "
            f"{e.get('cache', 'prompt + new tokens')}, verdict: {e.get('verdict')}"
        )
    print(markdown([f(raw) for f in rows]))


if __name__ == "__main__":
    main()
