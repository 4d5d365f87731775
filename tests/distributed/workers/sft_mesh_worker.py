"""examples/sft.py on a TP x FSDP mesh of any size, eager, bf16, packed, padded to 128.

    torchrun --nproc_per_node=TP*FSDP sft_mesh_worker.py TP FSDP BASE_DIR OUT_DIR STEPS [SFT OPTION ...]

Options after STEPS go to the example's parser as given (e.g. ``--torch_compile true``); with
``--activation_checkpointing true`` every decoder layer must then be checkpointed, and with
``"selective": true`` in ``--activation_checkpointing_kwargs`` through TRL's selective policy.

Trains STEPS steps with the example's SFTTrainer, saves with ``trainer.save_model``; rank 0
reloads the checkpoint on CPU with plain transformers and compares its logits with the
sharded model's. Every rank reports its host memory (RSS and private memory after the
imports, after building the trainer, after training, and the peak); rank 0 prints one
"MEM" line per rank and "SFT MESH OK" at the end.
"""

import os
import resource
import sys
import time
from pathlib import Path

T0 = time.monotonic()

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the shared helpers

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from helpers import full_logits, load_example  # noqa: E402

FP32_ATOL = 2e-4  # fp32 master weights: CPU reload vs sharded model, up to reduction order


def _mem_mib():
    """(RSS, private = RSS minus pages shared with other processes) of this process, MiB."""
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return fields["Rss"] / 1024, (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


def _checkpointing(model):
    """How the decoder layers are checkpointed: "off", "full", or "selective" (a SAC policy)."""
    layers = model.model.layers
    if not all(layer.gradient_checkpointing for layer in layers):
        assert not any(layer.gradient_checkpointing for layer in layers)
        return "off"
    policies = {layer._gradient_checkpointing_func.keywords.get("context_fn") is not None for layer in layers}
    assert len(policies) == 1, "some decoder layers are checkpointed selectively, others not"
    return "selective" if policies.pop() else "full"


def main():
    tp, fsdp, base_dir, out_dir, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    options = sys.argv[6:]
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig, SFTConfig, TrlParser

    mem = {"imports": _mem_mib()}
    ex = load_example("sft")
    parser = TrlParser((ex.ExampleArguments, SFTConfig, ModelConfig))
    parser.set_defaults(
        packing=True,
        packing_strategy="wrapped",
        max_length=128,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        disable_tqdm=True,
    )
    argv = [
        "--base_model_dir",
        base_dir,
        "--output_dir",
        out_dir,
        "--max_steps",
        str(steps),
        "--tp_size",
        str(tp),
        "--fsdp_size",
        str(fsdp),
        "--bf16",
        "true",
        *options,
    ]
    example_args, training_args, model_args = parser.parse_args_into_dataclasses(argv)
    trainer = ex.build_trainer(example_args, training_args, model_args)
    mem["trainer"] = _mem_mib()
    dev = trainer.args.device
    local_rank = int(os.environ["LOCAL_RANK"])
    assert dev == torch.device("neuron", local_rank), dev
    assert trainer.args.pad_to_multiple_of == 128, trainer.args.pad_to_multiple_of
    assert dist.get_backend() == "neuron" and dist.get_world_size() == tp * fsdp
    rank = dist.get_rank()
    w = trainer.model.model.layers[0].self_attn.q_proj.weight
    assert w.device_mesh.device_type == "neuron" and w.to_local().device == dev, w
    mesh = dict(zip(w.device_mesh.mesh_dim_names, w.device_mesh.shape))
    assert mesh.get("tp", 1) == tp and mesh.get("fsdp", 1) == fsdp, mesh

    t_train = time.monotonic()
    trainer.train()
    t_train = time.monotonic() - t_train
    mem["trained"] = _mem_mib()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # the Trainer turns checkpointing on when training starts
    checkpointing = _checkpointing(trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False))
    if training_args.activation_checkpointing:
        selective = (training_args.activation_checkpointing_kwargs or {}).get("selective", False)
        assert checkpointing == ("selective" if selective else "full"), checkpointing
    assert len(losses) == steps and losses[-1] < losses[0], losses

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, trainer.model.config.vocab_size, (2, 24), generator=g)
    sharded = full_logits(trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False), ids.to(dev))
    trainer.save_model(out_dir)
    dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {k: (round(v[0]), round(v[1])) for k, v in mem.items()}
    report["peak_rss"] = round(peak)
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, (os.environ.get("GROUP_RANK", "0"), local_rank, report))

    if rank == 0:
        for r, (node, lr, rep) in enumerate(reports):
            print(f"MEM rank {r} node {node} local {lr} " + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
        peaks = [rep["peak_rss"] for _, _, rep in reports]
        private = [rep["trained"][1] for _, _, rep in reports]
        print(
            f"MEM total peak RSS {sum(peaks)} MiB (max {max(peaks)}), private after training {sum(private)} MiB "
            f"(max {max(private)}) over {len(reports)} ranks",
            flush=True,
        )
        files = sorted(os.listdir(out_dir))
        assert "model.safetensors" in files and "config.json" in files, files
        cpu_model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
        assert next(cpu_model.parameters()).device.type == "cpu"
        err = (full_logits(cpu_model, ids) - sharded).abs().max().item()
        moved = (
            (full_logits(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), ids) - sharded)
            .abs()
            .max()
        )
        assert err <= FP32_ATOL, f"CPU reload differs from the sharded model by {err}"
        assert moved > 100 * FP32_ATOL, f"training did not change the logits ({moved})"
        print(
            f"SFT MESH OK tp={tp} fsdp={fsdp} checkpointing {checkpointing} losses {[round(x, 3) for x in losses]} max|cpu-sharded| {err:.2e} "
            f"train {t_train:.0f} s, total {time.monotonic() - T0:.0f} s",
            flush=True,
        )
    dist.barrier()
    trainer.end()
    # Everything under test is done. Leave without interpreter teardown: with 16+ ranks on
    # two loaded cores, a rank's autograd device threads occasionally outlive the atexit
    # shutdown's grace period and abort the process at static destruction
    # ("terminate called without an active exception"), which is not what this run checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
