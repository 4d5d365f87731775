"""Random ops on DTensors and FSDP2 initialisation on neuron.

    torchrun --nproc_per_node=N dtensor_rng_worker.py

DTensor's offset-based RNG tracker reads the neuron generator's 16-byte (seed,
offset) state: shards of a Shard placement draw different numbers, replicas the
same, the offsets stay in sync across ranks, a seeded rerun draws the same, and
a user generator draws what the default one does.
Then PyTorch's FSDP2 example's initialisation (meta device, fully_shard,
to_empty(device="neuron"), reset_parameters) and one training step. Rank 0
prints "DTENSOR RNG OK".
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def gather(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return [o.cpu() for o in out]


def random_ops(mesh, dev):
    ws = dist.get_world_size()
    torch.manual_seed(42)
    sharded = distribute_tensor(torch.zeros(4 * ws, 8, device=dev), mesh, [Shard(0)]).uniform_()
    replicated = distribute_tensor(torch.zeros(4, 8, device=dev), mesh, [Replicate()]).normal_()
    # Dropout on a sequence-parallel activation (sharded on the sequence dimension).
    act = distribute_tensor(torch.ones(2, 4 * ws, 8, device=dev), mesh, [Shard(1)])
    dropped = F.dropout(act, 0.5, training=True)
    return sharded.to_local(), replicated.to_local(), dropped.to_local()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(32, 100)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


def fsdp2_init(dev):
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Model()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=dev)
    model.reset_parameters()
    for name, p in model.named_parameters():
        assert p.device.type == "neuron", name
        full = p.full_tensor().cpu()
        assert torch.isfinite(full).all(), name
        if name.endswith("fc1.weight"):
            # Each rank's shard of a randomly initialised weight is its own draw.
            rows = full.shape[0] // dist.get_world_size()
            chunks = full.split(rows)
            assert all(not torch.equal(chunks[0], c) for c in chunks[1:]), name
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(1)).to(dev)
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    opt.step()
    assert torch.isfinite(loss).item()
    return [p.full_tensor().cpu() for p in model.parameters()]


def user_generator_agrees_with_default(mesh):
    """A neuron generator passed to a DTensor random op draws what the default
    generator would, and advances as it does (PyTorch's test_init_with_user_generator).
    The tracker keeps the state of neuron:(rank % device count): a rank must run on
    that device, as torchrun's LOCAL_RANK and torch.neuron.set_device(rank) make it."""
    torch.manual_seed(42)
    rng = torch.Generator(device="neuron").manual_seed(42)
    a = torch.distributed.tensor.empty((8, 3), device_mesh=mesh, placements=[Shard(0)])
    b = torch.distributed.tensor.empty((8, 3), device_mesh=mesh, placements=[Shard(0)])
    for i in range(2):
        nn.init.uniform_(a, 0.0, 1.0)
        nn.init.uniform_(b, 0.0, 1.0, rng)
        assert torch.equal(a.full_tensor().cpu(), b.full_tensor().cpu()), f"user generator differs at draw {i}"
    assert torch.equal(rng.get_state(), torch.neuron.get_rng_state()), "user generator out of step"


def main():
    dist.init_process_group("neuron")
    rank, ws = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", rank)
    torch.neuron.set_device(dev)
    mesh = init_device_mesh("neuron", (ws,))

    sharded, replicated, dropped = random_ops(mesh, dev)
    shards = gather(sharded)
    assert all(not torch.equal(shards[0], s) for s in shards[1:]), "shards drew the same numbers"
    replicas = gather(replicated)
    assert all(torch.equal(replicas[0], r) for r in replicas), "replicas differ"
    masks = gather(dropped)
    assert all(not torch.equal(masks[0], m) for m in masks[1:]), "sequence shards got the same dropout mask"
    assert all(((m == 0) | (m == 2)).all() for m in masks)
    # The tracker leaves every rank's generator at the same offset, past the op.
    states = gather(torch.neuron.get_rng_state().to(dev))
    assert all(torch.equal(states[0], s) for s in states), "generator states diverged across ranks"
    assert states[0].numel() == 16 and states[0][8:].view(torch.int64).item() > 0

    again = random_ops(mesh, dev)
    for a, b in zip((sharded, replicated, dropped), again):
        assert torch.equal(a.cpu(), b.cpu()), "a seeded rerun drew different numbers"

    user_generator_agrees_with_default(mesh)

    params = fsdp2_init(dev)
    assert all(torch.equal(a, b) for a, b in zip(params, fsdp2_init(dev))), "FSDP2 init is not reproducible"

    dist.barrier()
    if rank == 0:
        print("DTENSOR RNG OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
