"""Data-parallel training of a model compiled in place (``model.compile()``), so the first module
call of the run is a compiled one: its module hooks run inside the compiled code. Gradients are
averaged by hand with all-reduce.

    torchrun --nproc-per-node 2 compiled_module.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))


def main():
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    torch.manual_seed(0)
    model = MLP().to("neuron")
    model.compile(backend="neuron", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + dist.get_rank())
    for step in range(2):
        x = torch.randn(8, 64, device="neuron")
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
