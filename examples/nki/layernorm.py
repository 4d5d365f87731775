"""NKI tutorial: LayerNorm (bn_stats / bn_aggr).

Run: python examples/nki/layernorm.py [trn2|trn3]
"""

import sys

import torch
from _common import check_and_report

from torch_neuronx.nki.kernels.layernorm import nki_layernorm, reference  # the kernel source

if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "trn2"
    x = torch.randn(1024, 768)
    gamma, beta = torch.randn(768), torch.randn(768)
    check_and_report(nki_layernorm, reference, x, gamma, beta, target=target)
