"""NKI's PyTorch integration: ``torch_neuronx.nki`` is :mod:`neuronsim.nki` (the torch-free
simulator) plus what needs torch, ``compare`` / ``estimate_torch`` (cost of the unfused
PyTorch ops, :mod:`.cost`) and ``wrap_nki`` / ``nki_op`` (kernels as torch ops, :mod:`.op`).

Those load on first use: they import ``torch._dynamo``, which ``import torch`` must not.
"""

import sys

from neuronsim import _alias, nki

nki._extend(
    {
        "compare": "torch_neuronx._nki.cost",
        "estimate_torch": "torch_neuronx._nki.cost",
        "wrap_nki": "torch_neuronx._nki.op",
        "nki_op": "torch_neuronx._nki.op",
        "NKIKernelCaller": "torch_neuronx._nki.op",
    }
)
# `import torch_neuronx.nki.language` and the `nki` / `neuronxcc.nki` names resolve to the
# same modules through the alias finder.
sys.modules.setdefault("torch_neuronx.nki", nki)
_alias.install()
