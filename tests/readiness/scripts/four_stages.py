"""Four pipeline stages, one per rank, as PyTorch's pipelining tutorial writes them: the stages are
built on the default group (no DeviceMesh, no group of their own) and run a 1F1B schedule.
``every``: a dry run runs every micro-batch on every stage (the reference a shortened step is
compared with)."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

if sys.argv[1:] == ["every"]:
    from torch_neuronx.readiness.dry import pipeline as _dry_pipeline

    _dry_pipeline.microbatches_to_run = lambda name, n, stages, stage: n

dist.init_process_group("neuron")
rank, stages = dist.get_rank(), dist.get_world_size()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
torch.manual_seed(rank)
block = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(device)
stage = PipelineStage(block, rank, stages, device, input_args=(torch.empty(2, 256, device=device),))
schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=lambda out, target: ((out - target) ** 2).mean())
opt = torch.optim.SGD(block.parameters(), lr=0.01)
x = torch.randn(16, 256, device=device)
for _step in range(2):
    losses = []
    if rank == 0:
        schedule.step(x)
    elif rank == stages - 1:
        schedule.step(target=x, losses=losses)
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
