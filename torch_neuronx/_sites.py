"""Where something was issued: the innermost frame of the user's code (or a library's), not the
machinery of torch, torch_neuronx or the standard library. Used by the compile backend (where a
compiled graph was called from) and by readiness (where ops, collectives and value reads were)."""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
import threading

import torch

# Frames in these trees are the machinery, not the code that issued an op.
_TORCH_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torch_neuronx"]))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
SITE_PACKAGES = tuple(sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib"))
_generated_dirs: tuple = ()  # backend neuron's generated code (``_generated_code_dirs``)


def _is_machinery(path: str) -> bool:
    return (
        path.startswith(_TORCH_DIRS)
        or (path.startswith("<") and path not in ("<stdin>", "<string>"))  # <frozen ...>, FX's <eval_with_key>
        or "torchinductor_" in path  # Inductor's generated code
        or path.startswith(_generated_dirs or _generated_code_dirs())  # backend neuron's
        or (path.startswith(_STDLIB) and not path.startswith(SITE_PACKAGES))
    )


def _generated_code_dirs() -> tuple:
    """Where backend neuron keeps the code it generates: a collective a compiled graph issues is
    the user's line that Dynamo traced, not the generated module's."""
    global _generated_dirs
    from ._dynamo import cache

    _generated_dirs = (cache.cache_root() + os.sep, os.path.join(tempfile.gettempdir(), cache.PRIVATE_DIR_PREFIX))
    return _generated_dirs


def user_frame():
    """The innermost frame outside torch, torch_neuronx and the standard library, or None."""
    f = sys._getframe(1)
    while f is not None and _is_machinery(f.f_code.co_filename):
        f = f.f_back
    return f


def frame_site(f) -> str:
    """``path:line (function)`` of a frame from :func:`user_frame`."""
    if f is not None:
        return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"
    # Autograd runs backward ops on its device thread, with no Python caller.
    return "autograd backward" if threading.current_thread() is not threading.main_thread() else "<no Python caller>"


def user_site() -> str:
    """The innermost caller outside torch, torch_neuronx and the standard library."""
    return frame_site(user_frame())


def in_library(path: str) -> bool:
    """A file of an installed package (site-packages), not the user's own."""
    return path.startswith(SITE_PACKAGES)
