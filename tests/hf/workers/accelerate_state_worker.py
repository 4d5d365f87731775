"""Accelerate on neuron with bf16 mixed precision and save_state/load_state, run by
``accelerate launch`` (1 or 2 processes). Usage: accelerate_state_worker.py CKPT_DIR

Trains a small model with dropout; saves the state after a few steps; records the next steps'
losses and neuron RNG draws; restores the state and replays them: everything (weights,
optimizer, scheduler, dataloader position, neuron RNG stream) must continue identically."""

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAVE_AT, REPLAY = 3, 3


def main():
    ckpt = sys.argv[1]
    acc = Accelerator(mixed_precision="bf16")
    world = acc.num_processes
    expected = DistributedType.MULTI_NEURON if world > 1 else DistributedType.NO
    assert acc.distributed_type == expected, acc.distributed_type
    # one process: accelerate's default device "neuron" (the current core); several: neuron:LOCAL_RANK
    assert acc.device.type == "neuron" and acc.device.index in (None, acc.local_process_index), acc.device
    assert torch.neuron.current_device() == acc.local_process_index
    assert acc.mixed_precision == "bf16"
    set_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8 * world * (SAVE_AT + REPLAY), 16, generator=g)
    loader = DataLoader(TensorDataset(x, x.flip(-1)), batch_size=8)
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    def step(batch):
        xb, yb = batch
        out = model(xb)
        # accelerate runs forward under autocast("neuron", bf16) and returns fp32 outputs
        assert seen.pop() == torch.bfloat16 and out.dtype == torch.float32, out.dtype
        loss = nn.functional.mse_loss(out.float(), yb)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        # a device-RNG draw, compared after the restore
        return loss.item(), torch.rand(4, device=acc.device).cpu()

    it = iter(loader)
    for _ in range(SAVE_AT):
        step(next(it))
    acc.save_state(ckpt)
    after = [step(next(it)) for _ in range(REPLAY)]
    final = [p.detach().cpu().clone() for p in model.parameters()]

    # scramble everything the checkpoint must bring back
    torch.neuron.manual_seed_all(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    # multi-process load_state defaults to map_location="on_device", which hands "neuron:N" to
    # safetensors; its Rust core only accepts a fixed list of device names, so load through the host
    acc.load_state(ckpt, map_location="cpu")
    skipped = acc.skip_first_batches(loader, SAVE_AT)
    replay = [step(b) for b in skipped]
    assert len(replay) == REPLAY, len(replay)
    for (l1, r1), (l2, r2) in zip(after, replay):
        assert l1 == l2, (after, replay)
        assert torch.equal(r1, r2), (r1, r2)  # the restored neuron RNG continues the same stream
    for a, b in zip(final, model.parameters()):
        assert torch.equal(a, b.detach().cpu())
    assert after[-1][0] < 1e3
    print(f"rank {acc.process_index}/{world}: ACCELERATE STATE OK losses {[round(l, 5) for l, _ in after]}", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
