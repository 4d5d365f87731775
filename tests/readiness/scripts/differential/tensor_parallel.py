"""Tensor and sequence parallelism as the PyTorch TP tutorial writes it: `parallelize_module` with
a plan of ColwiseParallel / RowwiseParallel and SequenceParallel for the norms, a few steps.

    torchrun --nproc-per-node 2 tensor_parallel.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.w2(nn.functional.gelu(self.w1(self.norm(x))))


def main():
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(2)]).to("neuron")
    for block in model:
        parallelize_module(
            block,
            mesh,
            {
                "norm": SequenceParallel(),
                "w1": ColwiseParallel(input_layouts=Shard(1)),  # all-gathers the sequence
                "w2": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatters it
            },
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    torch.manual_seed(1)  # every rank draws the same batch and keeps its share of the sequence
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(2):
        x = torch.randn(4, 32, 64, device="neuron").chunk(world, dim=1)[rank]
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
