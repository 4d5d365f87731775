"""Tensor and sequence parallelism with each block compiled, torchtitan's way: a vocabulary
embedding whose output DTensor moves from the hidden dimension to the sequence (an all-to-all,
Shard(2) to Shard(1)), then blocks compiled one by one with ``block.compile()``, a few steps.

    torchrun --nproc-per-node 2 tp_compiled_blocks.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def main():
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    torch.manual_seed(0)
    embed = nn.Embedding(256, 64).to("neuron")
    blocks = nn.ModuleList([Block(64) for _ in range(3)]).to("neuron")
    parallelize_module(embed, mesh, ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)))
    for block in blocks:
        plan = {
            "norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.0": ColwiseParallel(),
            "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(block, mesh, plan)
        block.compile(backend="neuron", fullgraph=True)
    params = [*embed.parameters(), *blocks.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    for step in range(2):
        h = embed(torch.randint(256, (2, 32), device="neuron"))
        for block in blocks:
            h = block(h)
        loss = h.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
