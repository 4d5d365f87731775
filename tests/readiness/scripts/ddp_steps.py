"""Two ranks of DDP: per step one all-reduce of the 32x32 float32 gradient (4096 bytes)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
model = DDP(torch.nn.Linear(32, 32, bias=False).to("neuron"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.ones(4, 32, device="neuron")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
