"""Registers `neuron` with PyTorch (PrivateUse1): name, device module, methods."""

import atexit
import threading

import torch

from neuronsim import hardware as _hardware

from . import _C

# The runtime models instance types from the one hardware table; hand it over
# before anything can start the runtime.
_C._set_hardware_tables(
    [(c.name, c.physical_cores, c.hbm_bytes, list(c.lnc_allowed), c.lnc_default) for c in _hardware.CHIPS.values()],
    [(i.name, i.chip, i.chips) for i in _hardware.INSTANCES.values()],
)
_lock = threading.Lock()
_done = False


def register():
    """Register the device with PyTorch (idempotent)."""
    global _done
    with _lock:
        if _done:
            return
        torch.utils.rename_privateuse1_backend("neuron")
        from . import neuron as device_module

        torch._register_device_module("neuron", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
        _C._register_cpu_kernel_routes()
        from . import _compat, _dynamo, distributed

        _compat.apply()
        distributed.register_backend()  # c10d backend "neuron"
        _dynamo.register()  # torch.compile(backend="neuron"), lazily: see _dynamo
        # The compile backend's metrics, under torch.neuron as in the real
        # TorchNeuron; wired here so the device module never imports _dynamo.
        device_module.get_dynamo_metrics = _dynamo.get_dynamo_metrics
        device_module.reset_dynamo_metrics = _dynamo.reset_dynamo_metrics
        atexit.register(_shutdown_autograd_threads)
        _done = True


def _shutdown_autograd_threads() -> None:
    # Python's own threads at exit (non-daemon ones are joined by now); a foreign thread that
    # asked for its Thread object (a _DummyThread) is not one of them
    known = {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
    _C._shutdown_autograd_threads(known)


def is_neuron_runtime_initialized() -> bool:
    """True once this process has used a neuron device."""
    return _C._is_initialized()
