"""Supervised fine-tuning of a small Llama-style model with TRL's ``SFTTrainer`` on ``neuron``.

The corpus ships with torch-neuronx; the tokenizer (byte-level BPE) is trained locally and
the base model is built from a config, so nothing is downloaded. Everything else is plain
TRL / transformers / PEFT (every ``SFTConfig`` / ``ModelConfig`` option works): the same
script runs on any accelerator.

    # one process (neuron:0), packed sequences, compiled with backend "neuron", bf16
    python examples/sft.py --output_dir runs/sft --max_steps 60 --torch_compile true --bf16 true

    # PEFT LoRA on one process
    python examples/sft.py --output_dir runs/sft-lora --max_steps 60 --use_peft --lora_r 16

    # tensor parallel x FSDP through transformers' DistributedConfig: TP_SIZE * FSDP_SIZE processes
    torchrun --nproc_per_node=4 examples/sft.py --tp_size 2 --fsdp_size 2 \
        --output_dir runs/sft-tp2-fsdp2 --max_steps 60 --torch_compile true --bf16 true

The trained model is written by ``trainer.save_model`` as a standard checkpoint
(``config.json`` + ``model.safetensors`` + tokenizer; adapter files with ``--use_peft``)
that loads anywhere with ``AutoModelForCausalLM.from_pretrained``.
"""

import os
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class ExampleArguments:
    tp_size: int = field(default=1, metadata={"help": "tensor-parallel degree (DistributedConfig.tp_size)"})
    fsdp_size: int = field(default=1, metadata={"help": "FSDP degree (DistributedConfig.fsdp_size)"})
    base_model_dir: str = field(
        default="runs/tiny-llama-base",
        metadata={"help": "where the tiny base model and tokenizer are built when --model_name_or_path is not given"},
    )
    corpus: str = field(default=None, metadata={"help": "UTF-8 text file to train on (default: the shipped corpus)"})
    save_final: bool = field(default=True, metadata={"help": "write the trained model to --output_dir at the end"})


def _check_world_size(example_args) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if example_args.tp_size * example_args.fsdp_size != world:
        raise ValueError(
            f"--tp_size {example_args.tp_size} x --fsdp_size {example_args.fsdp_size} must equal the "
            f"number of processes ({world}); launch with torchrun --nproc_per_node=TP_SIZE*FSDP_SIZE"
        )
    return world


def build_trainer(example_args, training_args, model_args):
    """The ``SFTTrainer`` this script runs (also used by the tests)."""
    import torch
    from transformers import AutoTokenizer
    from transformers.distributed import DistributedConfig
    from trl import SFTTrainer, get_peft_config

    from torch_neuronx.demo.hf import build_base_checkpoint, corpus_dataset, load_corpus

    world = _check_world_size(example_args)
    model_path = model_args.model_name_or_path or build_base_checkpoint(example_args.base_model_dir)
    if os.path.isdir(model_path):
        # PEFT records this path in adapter_config.json as the base model: a relative one would
        # make the adapter load only from this working directory (elsewhere it is taken for a Hub id)
        model_path = os.path.abspath(model_path)

    model_init_kwargs = dict(training_args.model_init_kwargs or {})
    model_init_kwargs.setdefault("dtype", model_args.dtype or torch.float32)
    if world > 1:
        model_init_kwargs["distributed_config"] = DistributedConfig(
            tp_size=example_args.tp_size, fsdp_size=example_args.fsdp_size
        )
        # DistributedConfig places the shards itself; TRL drops its default device_map="auto" only
        # for MULTI_GPU/DEEPSPEED, so say it here (transformers refuses TP together with a device_map)
        model_init_kwargs["device_map"] = None
    training_args.model_init_kwargs = model_init_kwargs

    return SFTTrainer(
        model=model_path,
        args=training_args,
        train_dataset=corpus_dataset(load_corpus(example_args.corpus)),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        peft_config=get_peft_config(model_args),
    )


def main():
    from trl import ModelConfig, SFTConfig, TrlParser

    class Parser(TrlParser):
        def _print_message(self, message, file=None):
            # argparse prints usage, help and errors here: once under torchrun, not once per rank
            if int(os.environ.get("RANK", "0")) == 0:
                super()._print_message(message, file)

    parser = Parser((ExampleArguments, SFTConfig, ModelConfig))
    # defaults for the tiny model and corpus; activation checkpointing (on by default in TRL)
    # only costs time at this size (--activation_checkpointing true works, compiled too; compiled
    # with --tp_size > 1, add --activation_checkpointing_kwargs '{"selective": true}': PyTorch 2.13
    # cannot compile full checkpointing of tensor-parallel layers, see docs/huggingface.md)
    parser.set_defaults(
        packing=True,
        packing_strategy="wrapped",
        max_length=128,
        per_device_train_batch_size=8,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        activation_checkpointing=False,
    )
    example_args, training_args, model_args = parser.parse_args_and_config()
    try:
        _check_world_size(example_args)
    except ValueError as e:
        parser.error(str(e))
    trainer = build_trainer(example_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if example_args.save_final:
        trainer.save_model(training_args.output_dir)
        trainer.accelerator.print(f"model saved to {training_args.output_dir} (device {trainer.args.device})")
    trainer.end()


if __name__ == "__main__":
    main()
