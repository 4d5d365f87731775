"""NKI tutorial: tiled matmul (lhsT.T @ rhs), basic and with hoisted loads.

Run: python examples/nki/matmul.py [trn2|trn3]
"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.matmul import nki_matmul_hoisted, nki_matmul_tiled, reference  # kernels

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    lhsT = torch.randn(512, 256, dtype=torch.bfloat16)
    rhs = torch.randn(512, 1024, dtype=torch.bfloat16)
    for kernel in (nki_matmul_tiled, nki_matmul_hoisted):
        check_and_report(kernel, reference, lhsT, rhs, target=target, atol=0.5, rtol=2e-2)
