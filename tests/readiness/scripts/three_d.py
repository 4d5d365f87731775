"""A tiny 3-D job as a user writes one: data x pipeline x tensor parallel (DeviceMesh), a 1F1B
schedule over two stages of a tensor-parallel MLP, the gradients all-reduced over the data-parallel
dimension. ``branch``: the last rank issues one all-reduce more (a bug a rank's branch makes)."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("neuron")
mesh = init_device_mesh("neuron", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).to(device)
parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
pp = mesh["pp"].get_local_rank()
microbatch = torch.empty(2, 32, device=device)  # each stage's input: a micro-batch of activations
stage = PipelineStage(mlp, pp, 2, device, input_args=(microbatch,), group=mesh["pp"].get_group())
schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=lambda out, target: ((out - target) ** 2).mean())
opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
x = torch.randn(16, 32, device=device)
for _step in range(2):
    losses = []
    schedule.step(*((x,) if pp == 0 else ()), **({"target": x, "losses": losses} if pp == 1 else {}))
    for p in mlp.parameters():
        dist.all_reduce(p.grad.to_local(), group=mesh["dp"].get_group())
    if sys.argv[1:] == ["branch"] and dist.get_rank() == dist.get_world_size() - 1:
        dist.all_reduce(torch.ones(4, device=device), group=mesh["dp"].get_group())
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
