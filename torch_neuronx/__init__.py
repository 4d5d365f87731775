"""torch-neuronx: AWS Trainium as the native PyTorch device ``neuron``.

Importing torch is enough: the ``torch.backends`` entry point calls
:func:`_autoload`, which registers the device, ``torch.neuron`` and the
generated ``Tensor.neuron()`` / ``Module.neuron()`` methods. Without Trainium
hardware the device runs on the built-in NeuronCore simulator.
"""


def _autoload():
    """Entry point of the ``torch.backends`` group (runs at ``import torch``)."""
    # Defined before `import torch`: importing this package first makes torch
    # autoload it while this module is still initialising.
    from ._registration import register

    register()


import torch  # noqa: E402

from . import _C  # noqa: E402,F401  (loads the C++ device core)
from ._registration import is_neuron_runtime_initialized  # noqa: E402
from .neuron.random import cpu_equal_rng
from .neuron.streams import Event, Stream
from .ops_tracking import clear_op_tracking, get_executed_ops, get_fallback_ops

__version__ = "0.1.0"

__all__ = [
    "Event",
    "Stream",
    "clear_op_tracking",
    "cpu_equal_rng",
    "get_executed_ops",
    "get_fallback_ops",
    "is_neuron_runtime_initialized",
    "nki_op",
    "readiness",
    "wrap_nki",
]


def __getattr__(name):
    # NKI's PyTorch integration loads on first use: it imports torch._dynamo,
    # which plain `import torch` must not.
    if name in ("nki_op", "wrap_nki"):
        from ._nki import op

        return getattr(op, name)
    if name == "readiness":
        import importlib

        return importlib.import_module(".readiness", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_autoload()

# torch_neuronx.nki is the torch-free NKI simulator, neuronsim.nki, with its PyTorch
# integration added (and `import nki` / `neuronxcc.nki` unless a real NKI is installed).
from ._nki import nki  # noqa: E402
