"""Access to the one hardware table, ``torch_neuronx._hardware``, without torch.

``torch_neuronx/__init__.py`` imports torch; NumPy-only NKI code (``import nki``) must
not. When the parent package is not imported yet, the table's file is loaded under its
real module name, so a later ``import torch_neuronx`` reuses the same module object.
"""

import importlib
import importlib.util
import os
import sys

_NAME = "torch_neuronx._hardware"


def hardware_table():
    """The ``torch_neuronx._hardware`` module."""
    mod = sys.modules.get(_NAME)
    if mod is not None:
        return mod
    if "torch_neuronx" in sys.modules:
        return importlib.import_module(_NAME)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_hardware.py")
    spec = importlib.util.spec_from_file_location(_NAME, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return mod
