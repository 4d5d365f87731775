"""Shared runner of the NKI tutorial examples: check against PyTorch, print the cost."""

import torch

from torch_neuronx import nki


def check_and_report(kernel, reference, *args, atol=1e-4, rtol=1e-4, target="trn2", **kwargs):
    """Run ``kernel`` in the simulator on neuron tensors, compare with ``reference`` on CPU,
    and print the cost model's estimate next to the unfused PyTorch op sequence."""
    dev_args = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args]
    out = kernel(*dev_args, **kwargs)
    expected = reference(*args, **kwargs)
    torch.testing.assert_close(out.cpu(), expected, atol=atol, rtol=rtol)
    print(f"{kernel.__name__}: output on {out.device} matches PyTorch "
          f"(shape {tuple(out.shape)}, {out.dtype})")
    comparison = nki.compare(kernel, reference, *args, platform_target=target, **kwargs)
    print(comparison)
    return comparison
