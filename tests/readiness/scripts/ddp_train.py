"""DDP as users write it: rank 0's seed broadcast to all, a 3-layer MLP, gradient buckets of 1 MiB,
gradients accumulated over two micro-batches under no_sync, 3 optimizer steps.

    torchrun --nproc-per-node 2 ddp_train.py [--different-models] [--unused] [--bucket-view]
        [--static-graph] [--hook fp16|bf16|powersgd]
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--different-models", action="store_true", help="rank 1 builds a wider model (a bug)")
p.add_argument("--unused", action="store_true", help="find_unused_parameters, with a layer left unused")
p.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view")
p.add_argument("--static-graph", action="store_true", help="static_graph")
p.add_argument("--hook", choices=("fp16", "bf16", "powersgd"), help="a communication hook of PyTorch's")
args = p.parse_args()

dist.init_process_group("neuron")
rank = dist.get_rank()
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
seed = torch.tensor([1234 + rank], device="neuron")
dist.broadcast(seed, src=0)  # every rank takes rank 0's seed
torch.manual_seed(int(seed.item()))
width = 640 if args.different_models and rank == 1 else 512


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(256, width), torch.nn.Linear(width, 256), torch.nn.Linear(256, 256)

    def forward(self, x):
        h = self.l2(torch.relu(self.l1(x)))
        return h if args.unused else self.l3(h)  # --unused: l3 gets no gradient


model = DDP(
    Net().to("neuron"),
    bucket_cap_mb=1,
    find_unused_parameters=args.unused,
    gradient_as_bucket_view=args.bucket_view,
    static_graph=args.static_graph,
)
if args.hook == "powersgd":  # rank-2 approximation from the second step on, with error feedback
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
elif args.hook:
    model.register_comm_hook(None, getattr(default_hooks, f"{args.hook}_compress_hook"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    if step or not args.static_graph:  # static_graph's first backward must synchronize (PyTorch's rule)
        with model.no_sync():  # the first micro-batch accumulates without communicating
            model(torch.randn(32, 256, device="neuron")).pow(2).mean().backward()
    model(torch.randn(32, 256, device="neuron")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
