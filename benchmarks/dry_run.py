"""Dry runs at real size: Llama-3.1-8B and -70B fine-tuning with TRL on a whole trn2.48xlarge,
and common scripts from config-only model directories.

    python benchmarks/dry_run.py                      # 8B, TP=4 x FSDP=8, 32 ranks, and 8B on one core
    python benchmarks/dry_run.py --cases 70b          # 70B, TP=4 x FSDP=16, 64 ranks (LNC=2)
    python benchmarks/dry_run.py --cases 70b --ranks 0,63   # two of its ranks (--ranks of check)
    python benchmarks/dry_run.py --cases trainer-ddp,trainer-fsdp --ranks 0   # common scripts, below
    python benchmarks/dry_run.py --cases 8b-1024,70b-1024   # 1,024-rank jobs, by rank classes
    python benchmarks/dry_run.py --cases 70b-1024-compiled,8b-1024-tp4   # compiled layers; a layout that fails
    python benchmarks/dry_run.py --cases 70b-1024-selective   # AWS's selective activation checkpointing

Each case writes the public config of the model and a *header-only* checkpoint (safetensors
files whose headers give every tensor's name, dtype and shape, and whose data is a sparse
hole: no disk blocks, nothing to read), then runs ``examples/sft.py`` unmodified under
``torch-neuronx check --dry-run``: TRL's SFTTrainer, transformers' DistributedConfig, bf16,
sequence length 4096, activation checkpointing, two optimizer steps. The table gives the
wall time and the peak host memory of the whole job (all its processes together, as
proportional set size: pages the forked ranks share are counted once), against the same figures
of a plain CPU PyTorch process that only imports the libraries (the floor of any run), and
the report's verdict, per-rank peak and, for a job run by rank classes, how many classes it found.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import _llama  # this directory is the script's: on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {  # name -> (model, tp, fsdp, instance, instances)
    "8b": ("8b", 4, 8, "trn2.48xlarge", 1),
    "8b-1core": ("8b", 1, 1, "trn2.48xlarge", 1),
    "70b": ("70b", 4, 16, "trn2.48xlarge", 1),
    # the same fine-tuning scaled out: 32 trn2.48xlarge at LNC=2, 32 ranks each (torchrun --nnodes 32).
    # TP=8: at TP=4 x FSDP=256 transformers 5.23 cannot load the 128,256-row embedding on the
    # last FSDP rank (its shard of a TP+FSDP strided tensor is empty), which this dry run finds.
    "8b-1024": ("8b", 8, 128, "trn2.48xlarge", 32),
    "8b-1024-tp4": ("8b", 4, 256, "trn2.48xlarge", 32),
}


# Common scripts, each given a directory holding only the model's public config (check --dry-run
# stands in header-only weights): name -> (instance, world size, command builder).
SCRIPTS = {
    # the Hugging Face Trainer, full fine-tuning, DDP over all 64 cores (LNC=2) by torchrun
    "trainer-ddp": ("trn2.48xlarge", 64, lambda w: _torchrun(64) + _trainer(w, "--gradient_checkpointing", "true")),
    # the same through accelerate's FSDP plugin (FSDP2, activation checkpointing by the plugin)
    "trainer-fsdp": ("trn2.48xlarge", 64, lambda w: _accelerate(w, 64) + _trainer(w)),
    # TRL's SFT with a LoRA adapter (PEFT), one process on one core
    "lora-1core": ("trn2.48xlarge", 1, lambda w: [sys.executable] + _sft_lora(w)),
    # one FLUX.1-dev transformer denoising step at 1024 x 1024, diffusers' TP plan over 8 ranks
    "flux-tp8": ("trn2.48xlarge", 8, lambda w: _torchrun(8) + [_here("_flux_step.py"), _flux_dir(w)]),
    "flux-1core": ("trn2.48xlarge", 1, lambda w: [sys.executable, _here("_flux_step.py"), _flux_dir(w)]),
    # Llama-3.1-70B pre-training in AWS's published layout: 32 trn1.32xlarge, TP=32 x PP=8 x DP=4,
    # 1F1B over 256 micro-batches of one 8,192-token sequence (examples/llama_3d.py's defaults)
    "70b-1024": (
        "trn1.32xlarge",
        1024,
        lambda w: _torchrun_nodes(32, 32) + [_llama_3d(), "--config", "llama-3.1-70b", "--steps", "1"],
    ),
    # the same with each decoder layer compiled (AWS's run is compiled whole by XLA)
    "70b-1024-compiled": (
        "trn1.32xlarge",
        1024,
        lambda w: _torchrun_nodes(32, 32) + [_llama_3d(), "--config", "llama-3.1-70b", "--steps", "1", "--compile"],
    ),
    # the same with AWS's selective checkpointing: projections kept, attention's core and the gathers recomputed
    "70b-1024-selective": (
        "trn1.32xlarge",
        1024,
        lambda w: _torchrun_nodes(32, 32)
        + [_llama_3d(), "--config", "llama-3.1-70b", "--steps", "1", "--checkpointing", "selective"],
    ),
}

# FLUX.1-dev's transformer/config.json (public): 19 double and 38 single blocks, 24 heads of 128
FLUX_DEV = dict(
    _class_name="FluxTransformer2DModel",
    _diffusers_version="0.30.0.dev0",
    attention_head_dim=128,
    axes_dims_rope=[16, 56, 56],
    guidance_embeds=True,
    in_channels=64,
    joint_attention_dim=4096,
    num_attention_heads=24,
    num_layers=19,
    num_single_layers=38,
    patch_size=1,
    pooled_projection_dim=768,
)

FSDP2_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: {n}
machine_rank: 0
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_activation_checkpointing: true
"""


def _here(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def _torchrun(n: int) -> list:
    return ["torchrun", "--nproc-per-node", str(n)]


def _torchrun_nodes(nodes: int, per_node: int) -> list:
    return ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]


def _llama_3d() -> str:
    return os.path.join(REPO, "examples", "llama_3d.py")


def _accelerate(work: str, n: int) -> list:
    path = os.path.join(work, "fsdp2.yaml")
    with open(path, "w") as f:
        f.write(FSDP2_YAML.format(n=n))
    return ["accelerate", "launch", "--config_file", path]


def _llama_config_only(work: str) -> str:
    """Llama-3.1-8B's config.json and a small tokenizer: no weights."""
    path = os.path.join(work, "llama-3.1-8b-config-only")
    if not os.path.isdir(path):
        from transformers import LlamaConfig

        from torch_neuronx.demo.hf import train_tokenizer

        LlamaConfig(**_llama.config("8b"), dtype="bfloat16", architectures=["LlamaForCausalLM"]).save_pretrained(path)
        train_tokenizer(vocab_size=512).save_pretrained(path)
    return path


def _trainer(work: str, *extra: str) -> list:
    args = [_here("_trainer_llama.py"), "--model_name_or_path", _llama_config_only(work), "--seq_len", "4096"]
    args += ["--bf16", "true", "--per_device_train_batch_size", "1", "--max_steps", "2", "--logging_steps", "1"]
    return args + ["--save_strategy", "no", "--report_to", "none", "--output_dir", os.path.join(work, "out-ft"), *extra]


def _sft_lora(work: str) -> list:
    args = [os.path.join(REPO, "examples", "sft.py"), "--model_name_or_path", _llama_config_only(work)]
    args += ["--use_peft", "--lora_r", "16", "--lora_target_modules", "all-linear", "--bf16", "true"]
    args += ["--dtype", "bfloat16", "--max_length", "4096", "--per_device_train_batch_size", "1", "--max_steps", "2"]
    args += ["--activation_checkpointing", "true", "--output_dir", os.path.join(work, "out-lora")]
    return args + ["--logging_steps", "1", "--save_strategy", "no", "--save_final", "false"]


def _flux_dir(work: str) -> str:
    path = os.path.join(work, "flux.1-dev-transformer-config-only")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(FLUX_DEV, f, indent=2)
    return path


def build_checkpoint(model: str, path: str) -> int:
    from transformers import LlamaConfig

    from torch_neuronx.demo.hf import train_tokenizer
    from torch_neuronx.readiness import header_only_checkpoint

    tokenizer = train_tokenizer(vocab_size=512)  # any ids below the model's vocabulary do
    tokenizer.save_pretrained(path)
    return header_only_checkpoint(LlamaConfig(**_llama.config(model)), path)


def _tree_pss_bytes(root: int) -> int:
    """Memory of a process and all its descendants together (Linux /proc), shared pages once."""
    from torch_neuronx.readiness.launch.scheduler import pss_bytes

    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(d)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    total = 0
    for pid in tree:
        try:
            total += pss_bytes(pid)
        except OSError:  # the process ended meanwhile
            continue
    return total


class _PeakTreeMemory(threading.Thread):
    """Samples the job's total memory (all ranks together, shared pages once) every 0.5 s
    (a rank's loading peak lasts seconds; reading every process's smaps costs CPU)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, False

    def run(self) -> None:
        while not self.done:
            self.peak = max(self.peak, _tree_pss_bytes(self.pid))
            time.sleep(0.5)


def _sft_job(name: str, work: str, steps: int, seq: int) -> tuple[list, int, str]:
    model, tp, fsdp, instance, nodes = CASES[name]
    ckpt = os.path.join(work, f"llama-{model}")
    if not os.path.isdir(ckpt):
        os.makedirs(ckpt)
        build_checkpoint(model, ckpt)
    world = tp * fsdp
    script = [os.path.join(REPO, "examples", "sft.py"), "--model_name_or_path", ckpt]
    script += ["--tp_size", str(tp), "--fsdp_size", str(fsdp), "--bf16", "true", "--dtype", "bfloat16"]
    script += ["--max_length", str(seq), "--per_device_train_batch_size", "1", "--max_steps", str(steps)]
    script += ["--activation_checkpointing", "true", "--output_dir", os.path.join(work, f"out-{name}")]
    script += ["--logging_steps", "1", "--save_strategy", "no", "--save_final", "false"]  # no data to save
    launcher = _torchrun_nodes(nodes, world // nodes)
    launcher = launcher if world > 1 else [sys.executable]
    return launcher + script, world, instance


def run_case(name: str, work: str, steps: int, seq: int, workers: int, ranks: str | None = None) -> dict:
    if name in SCRIPTS:
        instance, world, build = SCRIPTS[name]
        job = build(work)
    else:
        job, world, instance = _sft_job(name, work, steps, seq)
    out = os.path.join(work, f"report-{name}")
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", instance]
    cmd += ["--workers", str(workers), "--out", out] + (["--ranks", ranks] if ranks and world > 1 else []) + ["--"]
    cmd += job
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1")
    )
    sampler = _PeakTreeMemory(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.done = True
    wall = time.perf_counter() - t0
    with open(os.path.join(work, f"{name}.log"), "w") as f:
        f.write(stdout + stderr)
    rep = json.load(open(os.path.join(out, "report.json"))) if os.path.exists(os.path.join(out, "report.json")) else {}
    if not rep:
        print(stdout[-3000:], stderr[-3000:])
    return {
        "case": name,
        "ranks": world,
        "wall_s": wall,
        "host_gib": sampler.peak / 2**30,
        "verdict": rep.get("verdict", f"no report (exit {proc.returncode})"),
        "peak": max((m["peak_allocated"] for m in rep.get("memory", [])), default=0) / 2**30,
        "classes": len((rep.get("classes") or {}).get("classes", [])) or "-",  # a run of every rank: none
        "ranks_run": len(rep.get("ranks_run", [])),
    }


def _baseline_import_seconds() -> tuple[float, float]:
    """A plain CPU PyTorch process importing what the script imports: the floor of any run."""
    t0 = time.perf_counter()
    code = "import torch, transformers, trl; from transformers import AutoModelForCausalLM; from trl import SFTTrainer"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="8b,8b-1core", help=f"comma-separated, of {', '.join([*CASES, *SCRIPTS])}")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ranks", default=None, help="simulate only these ranks of each case, e.g. 0,63 (default: all)")
    p.add_argument("--work", default=None, help="where checkpoints and reports go (default: a temporary dir)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="dry-run-bench-")
    os.makedirs(work, exist_ok=True)
    base_s, base_gib = _baseline_import_seconds()
    print(f"plain CPU PyTorch process importing torch+transformers+trl: {base_s:.1f} s, {base_gib:.2f} GiB max RSS")
    print("| case | ranks | wall time | host memory (all processes) | verdict | peak per core | rank classes |")
    print("|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        r = run_case(name, work, args.steps, args.seq, args.workers, args.ranks)
        print(
            f"| {r['case']} | {r['ranks']} ({r['ranks_run']} run) | {r['wall_s']:.0f} s | "
            f"{r['host_gib']:.2f} GiB | {r['verdict'][:90]} | {r['peak']:.2f} GiB | {r['classes']} |"
        )
    print(f"reports in {work}")


if __name__ == "__main__":
    main()
