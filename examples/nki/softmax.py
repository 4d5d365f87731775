"""NKI tutorial: row softmax.  Run: python examples/nki/softmax.py [trn2|trn3]"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.softmax import nki_softmax, reference  # the kernel source

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    x = torch.randn(1024, 512)
    check_and_report(nki_softmax, reference, x, target=target, atol=1e-6, rtol=1e-5)
