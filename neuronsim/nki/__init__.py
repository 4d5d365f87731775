"""Neuron Kernel Interface (NKI) on the built-in NeuronCore simulator.

One package under four names: ``neuronsim.nki``, ``nki`` and ``neuronxcc.nki`` (when no
real AWS NKI is installed) and ``torch_neuronx.nki``. Kernels decorated with :func:`jit`
run exactly on host (NumPy), enforce the NeuronCore hardware rules, and report an
estimated Trainium device time from a per-engine cost model.

This package needs only NumPy and never imports torch: a kernel called with torch
tensors uses the torch its caller already imported. ``torch_neuronx`` adds the PyTorch
integration (``compare``, ``estimate_torch``, ``wrap_nki``, ``nki_op``) when it is
imported. Submodules load lazily so that ``import torch`` stays cheap.
"""

import importlib
import sys

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
}
_SUBMODULES = ("language", "isa", "kernels", "typing", "compiler")

__all__ = sorted(list(_EXPORTS) + list(_SUBMODULES))


def _extend(exports):
    """Add names defined outside this package, ``{name: absolute module name}``, loaded on
    first use like the others (``torch_neuronx`` adds its PyTorch integration this way)."""
    _EXPORTS.update(exports)
    __all__[:] = sorted(list(_EXPORTS) + list(_SUBMODULES))


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    hint = "" if "torch_neuronx" in sys.modules else " (its PyTorch integration is added by `import torch_neuronx`)"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}{hint}")


def __dir__():
    return __all__
