"""torch.compile backend ``neuron`` (registered lazily: importing this package is cheap).

``torch.compile(model, backend="neuron")`` finds it through the
``torch_dynamo_backends`` entry point, or through :func:`register` (autoload).
"""
from __future__ import annotations

import sys

__all__ = [
    "neuron_backend",
    "get_dynamo_metrics",
    "reset_dynamo_metrics",
    "NeuronCompileError",
    "NeuronGraphCompilationError",
    "NeuronDynamicShapeError",
    "NeuronCpuInputError",
    "NeuronCompileOptionError",
]

_ERRORS = {
    "NeuronCompileError",
    "NeuronGraphCompilationError",
    "NeuronDynamicShapeError",
    "NeuronCpuInputError",
    "NeuronCompileOptionError",
}


def neuron_backend(gm, example_inputs, **kwargs):
    """Dynamo backend ``neuron``: see :mod:`torch_neuronx._dynamo.backend`."""
    from .backend import neuron_backend as impl

    return impl(gm, example_inputs, **kwargs)


def get_dynamo_metrics():
    """Compile metrics of backend "neuron"; ``print()`` the result for a report."""
    from .metrics import get_dynamo_metrics as impl

    return impl()


def reset_dynamo_metrics() -> None:
    """Reset the counters of :func:`get_dynamo_metrics`."""
    from .metrics import reset_dynamo_metrics as impl

    impl()


def register() -> None:
    """Make ``backend="neuron"`` known to Dynamo without importing Dynamo now.

    Installed packages also get it from the ``torch_dynamo_backends`` entry
    point; a source tree on sys.path has no entry points, so registration also
    happens when Dynamo's backend registry is first imported. Importing
    torch._dynamo here would add ~1.5 s to ``import torch``.
    """
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is not None:
        _register_with(registry)
    elif _RegistryHook not in sys.meta_path:
        sys.meta_path.insert(0, _RegistryHook)


def _register_with(registry) -> None:
    if "neuron" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=neuron_backend, name="neuron")


class _RegistryHook:
    """Import hook: registers the backend right after Dynamo's registry module loads."""

    _NAME = "torch._dynamo.backends.registry"

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != cls._NAME:
            return None
        sys.meta_path.remove(cls)  # one-shot; also avoids finding ourselves below
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register_with(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def __getattr__(name):
    if name in _ERRORS:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
