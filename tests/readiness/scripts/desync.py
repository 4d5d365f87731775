"""Distributed bugs that hang a job (and the same script without them), for the desync tests.

torchrun --nproc-per-node 2 desync.py CASE      (CASE: ok, skip_barrier, uneven_batches,
                                                 swapped, shapes, membership, missing_send,
                                                 last_batch)
"""

import sys

import torch
import torch.distributed as dist

case = sys.argv[1]
dist.init_process_group("neuron")
rank = dist.get_rank()
torch.neuron.set_device(rank)
a = torch.ones(4, device="neuron")
b = torch.ones(8, device="neuron")

dist.all_reduce(a)  # every case starts alike
if case == "skip_barrier" and rank == 0:
    dist.barrier()  # only rank 0 waits here
batches = 3 + (1 if case == "uneven_batches" and rank == 1 else 0)  # rank 1's shard has one batch more
for step in range(batches):
    dist.all_reduce(a * step)
if case == "swapped" and rank == 1:
    dist.all_reduce(b)
    dist.all_reduce(a)
elif case == "swapped":
    dist.all_reduce(a)
    dist.all_reduce(b)
if case == "shapes":
    dist.all_reduce(a if rank == 0 else b)
if case == "membership":
    group = dist.new_group([0] if rank == 0 else [0, 1])
    if rank == 0:
        dist.all_reduce(a, group=group)
if case in ("ok", "missing_send"):  # a two-stage pipeline: rank 0 sends each micro-batch to rank 1
    for micro in range(3):
        if rank == 0 and not (case == "missing_send" and micro == 2):
            dist.send(a, dst=1)
        elif rank == 1:
            dist.recv(a, src=0)
if case in ("ok", "last_batch"):  # a compiled training step; rank 1's last batch is shorter
    model = torch.nn.Linear(8, 8).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step_fn = torch.compile(model, backend="neuron")
    for step in range(2):
        rows = 3 if case == "last_batch" and rank == 1 and step == 1 else 4
        step_fn(torch.ones(rows, 8, device="neuron")).sum().backward()
        opt.step()
        opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
