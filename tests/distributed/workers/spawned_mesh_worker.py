"""Ranks started without torchrun (torch.multiprocessing.spawn, as PyTorch's own
distributed tests start them): no LOCAL_RANK, so no rank owns a device at start-up.

    python spawned_mesh_worker.py N

Joining the "neuron" group leaves the device uninitialised, as NCCL leaves CUDA, so
DeviceMesh binds each rank to neuron:(rank % devices) as it does on CUDA. Then the
check of PyTorch's test_init_with_user_generator: a user generator seeded like the
default one draws what the default one does on every rank, twice, and the draws
with the user generator leave the default stream alone. Rank 0 prints "SPAWNED MESH OK".
"""

import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, empty


def run(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("neuron", rank=rank, world_size=world_size)
    assert not torch.neuron.is_initialized()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeviceMesh's "no LOCAL_RANK, binding by rank" warning
        mesh = init_device_mesh("neuron", (world_size,))
    assert torch.neuron.is_initialized()
    assert torch.neuron.current_device() == rank % torch.neuron.device_count(), torch.neuron.current_device()

    torch.manual_seed(42)
    rng = torch.Generator(device="neuron").manual_seed(42)
    t1 = empty((8, 3), device_mesh=mesh, placements=[Shard(0)])
    t2 = empty((8, 3), device_mesh=mesh, placements=[Shard(0)])
    for i in range(2):
        torch.nn.init.uniform_(t1, 0.0, 1.0)
        torch.nn.init.uniform_(t2, 0.0, 1.0, rng)
        assert torch.equal(t1.full_tensor().cpu(), t2.full_tensor().cpu()), f"draw {i} differs on rank {rank}"
    dist.barrier()
    if rank == 0:
        print("SPAWNED MESH OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1])
    mp.spawn(run, args=(n, int(sys.argv[2]) if len(sys.argv) > 2 else 29517), nprocs=n)
