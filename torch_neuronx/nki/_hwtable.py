"""Access to the one hardware table, ``torch_neuronx._hardware``, and the settings registry
it reads, without torch.

``torch_neuronx/__init__.py`` imports torch; NumPy-only NKI code (``import nki``) must
not. When the parent package is not imported yet, the table's file is loaded under its
real module name, so a later ``import torch_neuronx`` reuses the same module object.
"""

import importlib
import importlib.util
import os
import sys


def _standalone(name: str):
    """The module ``torch_neuronx.<name>`` (stdlib-only), loaded from its file under its real
    name when the parent package is not imported yet."""
    full = f"torch_neuronx.{name}"
    mod = sys.modules.get(full)
    if mod is not None:
        return mod
    if "torch_neuronx" in sys.modules:
        return importlib.import_module(full)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"{name}.py")
    spec = importlib.util.spec_from_file_location(full, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[full] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[full]
        raise
    return mod


def settings():
    """The ``torch_neuronx._settings`` module (the registry of environment variables)."""
    return _standalone("_settings")


def hardware_table():
    """The ``torch_neuronx._hardware`` module."""
    settings()  # first: the table reads the instance type through it
    return _standalone("_hardware")
