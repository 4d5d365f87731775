"""Full fine-tuning of a causal LM with the Hugging Face ``Trainer``, as a user writes it: the
model from ``--model_name_or_path``, every ``TrainingArguments`` option from the command line,
and a dataset of random token ids of ``--seq_len`` (the dry-run benchmark needs no corpus).

    torchrun --nproc-per-node 64 benchmarks/_trainer_llama.py --model_name_or_path DIR \
        --output_dir runs/ft --bf16 true --gradient_checkpointing true --max_steps 2
    accelerate launch --config_file fsdp2.yaml benchmarks/_trainer_llama.py ...   # the FSDP plugin
"""

import os
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a model directory (config-only works under check --dry-run)"})
    seq_len: int = field(default=4096, metadata={"help": "tokens per sample"})
    dtype: str = field(default="bfloat16", metadata={"help": "dtype the weights are loaded in"})


class RandomTokens:
    """``n`` samples of ``seq_len`` token ids below ``vocab``, labels equal to the inputs."""

    def __init__(self, n: int, seq_len: int, vocab: int):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def main():
    import torch
    from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments

    script_args, training_args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    model = AutoModelForCausalLM.from_pretrained(
        script_args.model_name_or_path, dtype=getattr(torch, script_args.dtype)
    )
    n = training_args.per_device_train_batch_size * training_args.world_size * max(training_args.max_steps, 1)
    dataset = RandomTokens(n, script_args.seq_len, model.config.vocab_size)
    Trainer(model=model, args=training_args, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
