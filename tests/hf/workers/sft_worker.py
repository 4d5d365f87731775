"""examples/sft.py's SFTTrainer under test. Usage: sft_worker.py MODE BASE_DIR OUT_DIR

MODE ``tp_fsdp``: torchrun with 4 processes, DistributedConfig(tp_size=2, fsdp_size=2), packing,
bf16, torch_compile (backend neuron). MODE ``lora``: one process, PEFT LoRA. Both train a few
steps, save with ``trainer.save_model`` and check the checkpoint on CPU against the trained
model's logits on neuron."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the shared helpers

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from helpers import full_logits, load_example  # noqa: E402

STEPS = 4
# Master weights are fp32 and bf16 is autocast only, so in fp32 the checkpoint on CPU must match the
# trained neuron model up to reduction order (TP splits the matmuls): FP32_ATOL. The model as the
# Trainer runs it (forward wrapped in bf16 autocast) against the fp32 CPU reload: BF16_ATOL.
FP32_ATOL, BF16_ATOL = 2e-4, 5e-2


def main():
    mode, base_dir, out_dir = sys.argv[1:4]
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig, SFTConfig, TrlParser

    ex = load_example("sft")
    parser = TrlParser((ex.ExampleArguments, SFTConfig, ModelConfig))
    parser.set_defaults(
        packing=True,
        packing_strategy="wrapped",
        max_length=128,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        activation_checkpointing=False,
    )
    argv = ["--base_model_dir", base_dir, "--output_dir", out_dir, "--max_steps", str(STEPS)]
    if mode == "tp_fsdp":
        argv += ["--tp_size", "2", "--fsdp_size", "2", "--bf16", "true", "--torch_compile", "true"]
    else:
        argv += [
            "--learning_rate",
            "1e-2",
            "--use_peft",
            "--lora_r",
            "8",
            "--lora_alpha",
            "16",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
        ]
    example_args, training_args, model_args = parser.parse_args_into_dataclasses(argv)
    trainer = ex.build_trainer(example_args, training_args, model_args)
    args = trainer.args
    dev = args.device
    assert dev == torch.device("neuron", int(os.environ.get("LOCAL_RANK", 0))), dev
    assert args.pad_to_multiple_of == 128, args.pad_to_multiple_of  # TRL's neuron default
    rank = dist.get_rank() if dist.is_initialized() else 0

    if mode == "tp_fsdp":
        assert dist.get_backend() == "neuron" and dist.get_world_size() == 4
        w = trainer.model.model.layers[0].self_attn.q_proj.weight
        assert isinstance(w, DTensor) and w.device_mesh.device_type == "neuron", type(w)
        assert w.to_local().device == dev, w.to_local().device
        assert args.torch_compile_backend == "neuron", args.torch_compile_backend
        before = None
    else:
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable), trainable
        before = {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters()}

    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    assert result.global_step == STEPS

    if before is not None:  # LoRA: the base stays frozen, the adapters (B starts at zero) moved
        for n, p in trainer.model.named_parameters():
            changed = not torch.equal(before[n], p.detach().cpu())
            assert changed == ("lora_B" in n) or "lora_A" in n, (n, changed)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, trainer.model.config.vocab_size, (2, 24), generator=g)
    trained_bf16 = full_logits(trainer.model, ids.to(dev))  # forward as the Trainer wrapped it (autocast)
    trained = full_logits(trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False), ids.to(dev))
    trainer.save_model(out_dir)
    if dist.is_initialized():
        dist.barrier()

    if rank == 0:
        files = sorted(os.listdir(out_dir))
        if mode == "lora":
            from peft import AutoPeftModelForCausalLM

            assert "adapter_model.safetensors" in files and "adapter_config.json" in files, files
            cpu_model = AutoPeftModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
        else:
            assert "model.safetensors" in files and "config.json" in files, files
            cpu_model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
        assert next(cpu_model.parameters()).device.type == "cpu"
        base = full_logits(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), ids)
        reloaded = full_logits(cpu_model, ids)
        err = (reloaded - trained).abs().max().item()
        err_bf16 = (reloaded - trained_bf16).abs().max().item()
        moved = (base - trained).abs().max().item()
        assert err <= FP32_ATOL, f"CPU reload differs from the trained neuron model by {err} (fp32)"
        assert err_bf16 <= BF16_ATOL, f"CPU reload differs from the trained neuron model by {err_bf16} (bf16)"
        assert moved > 100 * FP32_ATOL, f"training did not change the logits ({moved})"
        print(
            f"SFT {mode} OK losses {[round(l, 4) for l in losses]} max|cpu-neuron| fp32 {err:.2e} "
            f"bf16-autocast {err_bf16:.2e} (training moved the logits by {moved:.3f})",
            flush=True,
        )
    if dist.is_initialized():
        dist.barrier()
    trainer.end()


if __name__ == "__main__":
    main()
