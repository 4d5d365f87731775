"""transformers from_pretrained(distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))
on neuron under torchrun (4 processes), a few training steps checked against a
single-process run. Usage: hf_worker.py MODEL_DIR"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

STEPS, BATCH, SEQ = 3, 4, 16


def train(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    return losses


def main():
    path = sys.argv[1]
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = torch.device("neuron", local_rank)
    assert torch.neuron.current_device() == local_rank
    model = AutoModelForCausalLM.from_pretrained(
        path, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2), dtype=torch.float32
    )
    assert dist.is_initialized() and dist.get_backend() == "neuron", dist.get_backend()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4
    w = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(w, DTensor) and w.to_local().device == dev, (type(w), w.device)
    assert w.device_mesh.device_type == "neuron"
    fsdp = model._mesh_manager.get_mesh("fsdp")
    dp_rank, dp_size = fsdp.get_local_rank(), fsdp.size()
    g = torch.Generator().manual_seed(5)
    data = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=g)
    per = BATCH // dp_size
    losses = train(model, data[dp_rank * per : (dp_rank + 1) * per].to(dev))
    losses = torch.stack([l.full_tensor() if isinstance(l, DTensor) else l for l in losses])
    dist.all_reduce(losses, op=dist.ReduceOp.AVG, group=fsdp.get_group())
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev)
    ref = torch.stack(train(ref_model, data.to(dev)))
    got, exp = losses.cpu().tolist(), ref.cpu().tolist()
    assert all(abs(a - b) < 1e-4 * max(1, abs(b)) for a, b in zip(got, exp)), (got, exp)
    assert got[-1] < got[0], got
    print(f"rank {rank}: HF DistributedConfig OK {got} ref {exp}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
