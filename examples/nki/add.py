"""NKI tutorial: elementwise add.  Run: python examples/nki/add.py [trn2|trn3]"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.add import nki_tensor_add, reference  # the kernel source

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    a, b = torch.randn(1000, 512), torch.randn(1000, 512)
    check_and_report(nki_tensor_add, reference, a, b, target=target, atol=0, rtol=0)
