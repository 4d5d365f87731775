"""FSDP1 (FullyShardedDataParallel) on 2 ranks: wrap, train, save, reload.

Run by torchrun with the device ("neuron" or "cpu") as argument; prints one
line per training step and the reloaded parameters' checksum, which the test
compares between the neuron run and the CPU (gloo) run.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def _say(line):
    # One write per line: the ranks share one stdout, and print() writes the text and
    # its newline separately when unbuffered, so two ranks' lines could run together.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def main():
    device_type, ckpt = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    dist.init_process_group("neuron" if device_type == "neuron" else "gloo")
    device = torch.device(device_type, rank) if device_type == "neuron" else torch.device("cpu")
    if device_type == "neuron":
        torch.neuron.set_device(rank)

    def wrap(module):
        # Two FSDP units (an inner one and the root), as auto-wrap policies make.
        module[2] = FSDP(module[2], device_id=device)
        return FSDP(module, device_id=device)

    model = wrap(build())
    assert all(p.device.type == device_type for p in model.parameters()), [p.device for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(3):
        x = torch.randn(8, 16, generator=g).to(device)
        y = torch.randn(8, 4, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        _say(f"RANK {rank} STEP {step} LOSS {loss.item():.8e}")

    # offload_to_cpu only where parameters are not on CPU already (FSDP1 on
    # CPU does not support offloading to where it is).
    cfg = FullStateDictConfig(offload_to_cpu=device_type != "cpu", rank0_only=False)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        state = model.state_dict()
    if rank == 0:
        torch.save(state, ckpt)
    dist.barrier()

    fresh = build()
    fresh.load_state_dict(torch.load(ckpt))
    fresh = wrap(fresh)
    with FSDP.state_dict_type(fresh, StateDictType.FULL_STATE_DICT, cfg):
        reloaded = fresh.state_dict()
    for k, v in state.items():
        assert torch.equal(reloaded[k].cpu(), v.cpu()), k
    total = sum(v.double().sum().item() for v in reloaded.values())
    out = fresh(torch.ones(2, 16).to(device))
    assert out.device.type == device_type
    _say(f"RANK {rank} RELOADED {total:.10e} OUT {out.sum().item():.8e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
