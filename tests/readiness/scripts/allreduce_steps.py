"""Two ranks: per step one all-reduce of a 1024-float32 gradient bucket."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
w = torch.nn.Parameter(torch.ones(1024, device="neuron"))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    (w * w).sum().backward()
    dist.all_reduce(w.grad)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
