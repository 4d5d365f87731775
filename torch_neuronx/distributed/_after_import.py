"""Run an action right after a PyTorch module is first imported.

torch.distributed's additions for neuron patch PyTorch modules (DTensor, context parallelism)
that ``import torch`` does not load; importing them eagerly would load DTensor, flex attention
and more at ``import torch``. So each addition waits for its module.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable

import torch

_SUPPORTED_TORCH = "2.13"


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds the real spec of a pending module and runs its actions after the module executes."""

    def __init__(self):
        self.pending: dict[str, list[tuple[Callable, str]]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        sys.meta_path.remove(self)  # find the real spec, not ourselves
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        # Wrap this module's own loader instance (one per module): the module keeps its real
        # loader, for tracebacks and inspect.
        exec_module = spec.loader.exec_module

        def exec_then_act(module):
            exec_module(module)
            # Dropped only now: a module whose import failed gets its actions when retried.
            for action, feature in self.pending.pop(fullname, ()):
                _run(action, module, feature)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_then_act
        return spec


def _run(action, module, feature):
    try:
        action(module)
    except (AttributeError, ImportError) as e:
        # Never break the import of PyTorch's module: the feature keeps PyTorch's behaviour.
        warnings.warn(
            f"torch-neuronx: {feature} is not available with this torch ({torch.__version__}; "
            f"torch-neuronx supports {_SUPPORTED_TORCH}): {e}",
            stacklevel=3,
        )


_finder = _AfterImportFinder()


def after_import(module_name: str, action: Callable, feature: str) -> None:
    """Call ``action(module)`` now if `module_name` is imported, else right after its first import.

    `feature` names what the action enables, for the warning given if this torch lacks what
    the action patches (the import itself then still succeeds)."""
    module = sys.modules.get(module_name)
    if module is not None:
        _run(action, module, feature)
        return
    actions = _finder.pending.setdefault(module_name, [])
    if all(a is not action for a, _ in actions):
        actions.append((action, feature))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
