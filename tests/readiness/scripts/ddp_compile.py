"""BERT pre-training as AWS configures phase 1, scaled down: BertForPreTraining from a BertConfig,
DDP, torch.compile, gradient accumulation under no_sync, BF16 autocast, AdamW. 2 layers of 64,
a vocabulary of 8192 (2 MiB of embeddings: DDPOptimizer splits the graph at DDP's 1 MiB first bucket).

    torchrun --nproc-per-node 2 ddp_compile.py [--backend neuron|aot_eager|eager]
"""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import BertConfig, BertForPreTraining

p = argparse.ArgumentParser()
p.add_argument("--backend", default="neuron")
args = p.parse_args()

dist.init_process_group("neuron")
rank = dist.get_rank()
local_rank = int(os.environ["LOCAL_RANK"])
torch.neuron.set_device(local_rank)
torch.manual_seed(42)
config = BertConfig(vocab_size=8192, hidden_size=64, num_hidden_layers=2, num_attention_heads=1, intermediate_size=256)
model = torch.compile(DDP(BertForPreTraining(config).to("neuron"), device_ids=[local_rank]), backend=args.backend)
opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.01)
g = torch.Generator().manual_seed(1000 + rank)


def micro_batch(batch=4, seq=32, predictions=5):
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    labels = torch.full_like(ids, -100)
    pos = torch.rand(batch, seq, generator=g).argsort(-1)[:, :predictions]
    labels.scatter_(1, pos, ids.gather(1, pos))
    ids.scatter_(1, pos, 103)  # [MASK]
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, -1)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    batch = dict(input_ids=ids, token_type_ids=types, attention_mask=torch.ones_like(ids), labels=labels)
    return {k: v.to("neuron") for k, v in dict(batch, next_sentence_label=nsp).items()}


for _step in range(3):
    for micro in range(2):  # the first micro-batch accumulates without communicating
        with model.no_sync() if micro == 0 else contextlib.nullcontext():
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = model(**micro_batch()).loss / 2
            loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
