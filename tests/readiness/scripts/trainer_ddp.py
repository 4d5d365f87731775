"""The Hugging Face Trainer as most fine-tuning scripts use it: under torchrun it wraps the model in DDP.

torchrun --nproc-per-node 2 trainer_ddp.py OUT_DIR
"""

import sys

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Toy(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.arange(32) % 128
        return {"input_ids": ids, "labels": ids}


cfg = LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
model = LlamaForCausalLM(cfg)
args = TrainingArguments(
    output_dir=sys.argv[1],
    per_device_train_batch_size=2,
    max_steps=3,
    logging_steps=1,
    report_to=[],
    save_strategy="no",
)
Trainer(model=model, args=args, train_dataset=Toy()).train()
