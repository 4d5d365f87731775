"""The four object collectives, with objects whose pickled sizes differ by rank; each rank writes what
it got to OUT/rank<R>.json.

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
x = torch.ones(4, device="neuron")
dist.all_reduce(x)  # the device's collectives go on after them
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"everyone": everyone, "config": config, "gathered": gathered, "share": share}, f)
dist.destroy_process_group()
