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
from .neuron.streams import Event, Stream
from .ops_tracking import clear_op_tracking, get_executed_ops, get_fallback_ops

__version__ = "0.1.0"

__all__ = [
    "Event",
    "Stream",
    "clear_op_tracking",
    "get_executed_ops",
    "get_fallback_ops",
    "is_neuron_runtime_initialized",
]

_autoload()
