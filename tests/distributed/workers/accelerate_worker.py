"""`accelerate launch` training script (MULTI_NEURON): DDP through accelerate on
neuron, losses checked against a single-process run of the same global batches."""
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from tiny_llama import VOCAB, TinyLlama, loss_fn  # noqa: E402

STEPS, PER_PROC, SEQ = 3, 2, 16


def main():
    acc = Accelerator()
    local_rank = int(os.environ["LOCAL_RANK"])
    world = acc.num_processes
    assert acc.distributed_type == DistributedType.MULTI_NEURON, acc.distributed_type
    assert acc.device == torch.device("neuron", local_rank), acc.device
    assert torch.neuron.current_device() == local_rank
    import torch.distributed as dist

    assert dist.get_backend() == "neuron", dist.get_backend()
    g = torch.Generator().manual_seed(3)
    # the same global batch at every step (fitted repeatedly)
    one = torch.randint(0, VOCAB, (PER_PROC * world, SEQ), generator=g)
    data = one.repeat(STEPS, 1)
    loader = DataLoader(TensorDataset(data), batch_size=PER_PROC, shuffle=False)
    torch.manual_seed(0)
    model = TinyLlama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = acc.prepare(model, opt, loader)
    assert next(model.parameters()).device == acc.device
    losses = []
    for (x,) in loader:
        assert x.device == acc.device
        loss = loss_fn(model(x), x)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    torch.manual_seed(0)
    ref_model = TinyLlama().to(acc.device)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    ref = []
    for _ in range(STEPS):
        x = one.to(acc.device)
        loss = loss_fn(ref_model(x), x)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref.append(loss.item())
    assert len(losses) == STEPS, losses
    assert all(abs(a - b) < 1e-4 * max(1, abs(b)) for a, b in zip(losses, ref)), (losses, ref)
    assert losses[-1] < losses[0]
    acc.wait_for_everyone()
    objs = acc.gather_for_metrics(torch.tensor([float(acc.process_index)], device=acc.device))
    assert objs.cpu().tolist() == [float(r) for r in range(world)], objs
    print(f"rank {acc.process_index}: ACCELERATE OK {losses} ref {ref}", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
