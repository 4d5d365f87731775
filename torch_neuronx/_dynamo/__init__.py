"""torch.compile backend ``neuron`` (registered lazily: importing this package is cheap).

``torch.compile(model, backend="neuron")`` finds it through the
``torch_dynamo_backends`` entry point, or through :func:`register` (autoload).
"""

from __future__ import annotations

import sys

__all__ = [
    "neuron_backend",
    "set_model_name",
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


_model_name: str | None = None


def set_model_name(name: str) -> None:
    """Name the graphs compiled from now on by backend "neuron" (until the next call).

    The name labels compile-cache entries, metrics, recompilation reports and
    saved artifacts. ``options={"model_name": ...}`` of one ``torch.compile``
    call takes precedence.
    """
    global _model_name
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"set_model_name expects a non-empty str, got {name!r}")
    _model_name = name.strip()


def current_model_name() -> str | None:
    """The name given to :func:`set_model_name`, if any."""
    return _model_name


def get_dynamo_metrics():
    """Compile metrics of backend "neuron"; ``print()`` the result for a report."""
    from .metrics import get_dynamo_metrics as impl

    return impl()


def reset_dynamo_metrics() -> None:
    """Reset the counters of :func:`get_dynamo_metrics`."""
    from .metrics import reset_dynamo_metrics as impl

    impl()


def register() -> None:
    """Make ``backend="neuron"`` and the neuron device known to the compiler, lazily.

    Installed packages also get the backend from the ``torch_dynamo_backends``
    entry point; a source tree on sys.path has none. Importing torch._dynamo
    here would add ~1.5 s to ``import torch``, so each registration runs right
    after the torch module it needs is first imported:

    - Dynamo's backend registry: ``backend="neuron"``;
    - Dynamo's device interfaces: the ``neuron`` device interface;
    - Dynamo's frame conversion: a frame of a DDP-wrapped module is compiled with the
      active dispatch modes off, as every other frame is
      (:func:`_inductor_glue.patch_ddp_optimizer_modes`);
    - Inductor's ``compile_fx``: the neuron code generator and lowering choices,
      so plain ``torch.compile(model)`` (backend "inductor") compiles neuron
      graphs exactly like backend "neuron" does.
    """
    for name, action in _AFTER_IMPORT.items():
        module = sys.modules.get(name)
        if module is not None:
            action(module)
        else:
            _PostImportHook.pending.add(name)
    if _PostImportHook.pending and _PostImportHook not in sys.meta_path:
        sys.meta_path.insert(0, _PostImportHook)


def _register_with(registry) -> None:
    if "neuron" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=neuron_backend, name="neuron")


def _register_device_interface(_module) -> None:
    from . import _inductor_glue

    _inductor_glue.register_device_interface()


def _patch_ddp_optimizer(_module) -> None:
    from . import _inductor_glue

    if _inductor_glue.torch_version_supported():
        _inductor_glue.patch_ddp_optimizer_modes()


def _install_inductor_glue(_module) -> None:
    from . import _inductor_glue

    # Never break Inductor for CPU users: on an unsupported torch, backend
    # "neuron" raises the version error when it is used.
    if _inductor_glue.torch_version_supported():
        _inductor_glue.install()


def _install_flex(module) -> None:
    from .. import _attention

    _attention.install_flex(module)


def _install_varlen(module) -> None:
    from .. import _attention

    _attention.install_varlen(module)


_AFTER_IMPORT = {
    "torch._dynamo.backends.registry": _register_with,
    "torch.nn.attention.flex_attention": _install_flex,
    "torch.nn.attention.varlen": _install_varlen,
    "torch._dynamo.device_interface": _register_device_interface,
    "torch._dynamo.convert_frame": _patch_ddp_optimizer,
    "torch._inductor.compile_fx": _install_inductor_glue,
}


class _PostImportHook:
    """Import hook: runs the action of `_AFTER_IMPORT` right after its module loads."""

    pending: set = set()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.pending:
            return None
        cls.pending.discard(name)
        sys.meta_path.remove(cls)  # find the real spec, not ourselves
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            if cls.pending:
                sys.meta_path.insert(0, cls)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PostImportLoader(spec.loader, _AFTER_IMPORT[name])
        return spec


class _PostImportLoader:
    def __init__(self, loader, action):
        self._loader, self._action = loader, action

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._action(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def __getattr__(name):
    if name in _ERRORS:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
