"""Neuron Kernel Interface (NKI) on the built-in NeuronCore simulator.

``from torch_neuronx import nki``; ``import torch_neuronx.nki.language as nl``;
``import torch_neuronx.nki.isa as nisa`` (also ``import nki`` / ``import nki.language``
when no real AWS NKI is installed). Kernels decorated with :func:`jit` run exactly on
host (NumPy), enforce the NeuronCore hardware rules, and report an estimated Trainium
device time from a per-engine cost model.

Submodules load lazily so that ``import torch`` (which installs the ``nki`` name
alias) stays cheap. The simulator itself needs only NumPy: ``import nki`` works in an
interpreter that never imports torch (torch is used only for torch tensor arguments).
"""

import importlib

_EXPORTS = {
    "jit": "._jit",
    "simulate": "._jit",
    "simulate_kernel": "._jit",
    "benchmark": "._jit",
    "baremetal": "._jit",
    "trace": "._jit",
    "Kernel": "._jit",
    "tensor": ".typing",
    "CostReport": "._cost_model",
    "estimate_torch": "._torch_cost",
    "compare": "._torch_cost",
    "Hardware": "._rules",
    "HARDWARE": "._rules",
    "TRN2": "._rules",
    "TRN3": "._rules",
    "get_hardware": "._rules",
    "NKIError": "._errors",
    "NKIPartitionError": "._errors",
    "NKITileSizeError": "._errors",
    "NKIMemoryError": "._errors",
    "NKIBufferError": "._errors",
    "NKIDtypeError": "._errors",
    "NKIShapeError": "._errors",
    "NKIIndexError": "._errors",
    "NKIContextError": "._errors",
    "NKIUninitializedError": "._errors",
    "wrap_nki": "._torch_op",
    "nki_op": "._torch_op",
    "NKIKernelCaller": "._torch_op",
}
_SUBMODULES = ("language", "isa", "kernels", "typing", "compiler")

__all__ = sorted(list(_EXPORTS) + list(_SUBMODULES))


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
