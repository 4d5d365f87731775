"""The four object collectives, with objects whose pickled sizes differ by rank, then point-to-point
objects and a small tensor from rank 0 to rank 1 and objects back; each rank writes what it got to
OUT/rank<R>.json.

    torchrun --nproc-per-node 2 object_collectives.py OUT
"""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("neuron")
rank = dist.get_rank()
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
mine = {"rank": rank, "name": "r" * (5 + 40 * rank)}  # another pickled size on every rank
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
config = [{"lr": 0.1, "seed": 7}] if rank == 0 else [None]
dist.broadcast_object_list(config, src=0)
gathered = [None] * dist.get_world_size() if rank == 0 else None
dist.gather_object(mine, gathered, dst=0)
share = [None]
dist.scatter_object_list(share, [{"part": r} for r in range(dist.get_world_size())], src=0)
if rank == 0:
    dist.send_object_list([{"shapes": [[2, 16, 64]]}, "from 0"], dst=1, device=torch.device("neuron"))
    dist.send(torch.tensor([7], device="neuron"), dst=1)
    received = [None]
    dist.recv_object_list(received, src=1)
elif rank == 1:
    received = [None, None]
    dist.recv_object_list(received, src=0, device=torch.device("neuron"))  # RECV FROM 0
    t = torch.zeros(1, dtype=torch.int64, device="neuron")
    dist.recv(t, src=0)
    received.append(t.item())  # the sender's value, known in a dry run too
    dist.send_object_list([("back", rank)], dst=0)
x = torch.ones(4, device="neuron")
dist.all_reduce(x)  # the device's collectives go on after them
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"everyone": everyone, "config": config, "gathered": gathered, "share": share, "received": received}, f)
dist.destroy_process_group()
