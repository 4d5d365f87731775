"""NKI tutorial: fused (flash-style) attention.

Run: python examples/nki/attention.py [trn2|trn3]
"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.attention import fused_attention, reference  # the kernel source

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    q, k, v = (torch.randn(1024, 64, dtype=torch.bfloat16) for _ in range(3))
    check_and_report(fused_attention, reference, q, k, v, target=target, atol=3e-2, rtol=3e-2, causal=True)
