"""`accelerate launch` training script (MULTI_NEURON): DDP through accelerate on
neuron, losses checked against a single-process run of the same global batches; then
Accelerate's gather family on tensors of 1 to 3 dimensions."""

import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from tiny_llama import VOCAB, TinyLlama, loss_fn  # noqa: E402

STEPS, PER_PROC, SEQ = 3, 2, 16


def _check_gather_family(acc, world):
    """gather / gather_for_metrics / pad_across_processes on tensors of 2+ dimensions: they
    all_gather_into_tensor into a flat buffer, which needs NCCL's element-count semantics."""
    rank = acc.process_index

    def mine(*shape, dtype=torch.float32):
        n = torch.Size(shape).numel()
        return (torch.arange(n) + 100 * rank).to(dtype).view(shape)

    def every(*shape, dtype=torch.float32):
        return torch.cat(
            [(torch.arange(torch.Size(shape).numel()) + 100 * r).to(dtype).view(shape) for r in range(world)]
        )

    for shape, dtype in [((1, 2), torch.float32), ((2, 3), torch.int64), ((2, 3, 4), torch.bfloat16)]:
        got = acc.gather(mine(*shape, dtype=dtype).to(acc.device))
        assert got.device == acc.device and torch.equal(got.cpu(), every(*shape, dtype=dtype)), (shape, got)
    nested = acc.gather({"logits": mine(2, 5).to(acc.device), "labels": mine(2, dtype=torch.int64).to(acc.device)})
    assert torch.equal(nested["logits"].cpu(), every(2, 5)), nested
    assert torch.equal(nested["labels"].cpu(), every(2, dtype=torch.int64)), nested
    got = acc.gather_for_metrics(mine(3, 4).to(acc.device))
    assert torch.equal(got.cpu(), every(3, 4)), got
    # ranks hold different lengths along dim 1: padded to the longest, then gathered
    ragged = mine(2, rank + 1).to(acc.device)
    padded = acc.pad_across_processes(ragged, dim=1, pad_index=-1)
    assert padded.shape == (2, world), padded.shape
    exp = torch.full((2, world), -1.0)
    exp[:, : rank + 1] = mine(2, rank + 1)
    assert torch.equal(padded.cpu(), exp), padded
    got = acc.gather(acc.pad_across_processes(ragged, dim=1, pad_index=-1, pad_first=True))
    assert got.shape == (2 * world, world), got.shape
    for r in range(world):
        row = got[2 * r : 2 * r + 2].cpu()
        assert torch.equal(row[:, : world - r - 1], torch.full((2, world - r - 1), -1.0)), row
        assert torch.equal(row[:, world - r - 1 :], (torch.arange(2.0 * (r + 1)) + 100 * r).view(2, r + 1)), row


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
    _check_gather_family(acc, world)
    print(f"rank {acc.process_index}: ACCELERATE OK {losses} ref {ref}", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
