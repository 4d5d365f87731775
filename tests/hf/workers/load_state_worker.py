"""Two ranks under torchrun: accelerator.load_state on neuron. The default multi-process load of a
safetensors checkpoint hands "neuron:N" to safetensors, which refuses it (documented in
docs/huggingface.md); map_location="cpu", or a checkpoint saved with safe_serialization=False,
restores the weights on every rank's core."""

import sys

import torch
from accelerate import Accelerator
from safetensors import SafetensorError


def main():
    out = sys.argv[1]
    acc = Accelerator()
    rank = acc.process_index
    assert acc.num_processes == 2 and acc.device == torch.device("neuron", rank), acc.device
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    loss = model(torch.randn(4, 8, device=acc.device)).pow(2).mean()
    acc.backward(loss)
    opt.step()
    saved = {k: v.detach().cpu().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    acc.save_state(f"{out}/safe")
    acc.save_state(f"{out}/pickle", safe_serialization=False)
    acc.wait_for_everyone()  # rank 0 writes the files the other rank reads next

    def scramble():
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)

    def check():
        for k, v in acc.unwrap_model(model).state_dict().items():
            assert v.device == acc.device, (k, v.device)
            assert torch.equal(v.cpu(), saved[k]), k

    scramble()
    try:
        acc.load_state(f"{out}/safe")
        raise AssertionError("safetensors accepted a neuron device string: update docs/huggingface.md")
    except SafetensorError as e:
        assert f"device neuron:{rank} is invalid" in str(e), e
    scramble()
    acc.load_state(f"{out}/safe", map_location="cpu")
    check()
    scramble()
    acc.load_state(f"{out}/pickle")
    check()
    acc.wait_for_everyone()
    print(f"rank {rank}: LOAD_STATE OK", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
