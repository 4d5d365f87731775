"""NKI tutorial: RMSNorm.  Run: python examples/nki/rmsnorm.py [trn2|trn3]"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.rmsnorm import nki_rmsnorm, reference  # the kernel source

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    x = torch.randn(1024, 2048, dtype=torch.bfloat16)
    w = torch.randn(2048, dtype=torch.bfloat16)
    check_and_report(nki_rmsnorm, reference, x, w, target=target, atol=2e-2, rtol=2e-2)
