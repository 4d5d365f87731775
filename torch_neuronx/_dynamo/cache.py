"""Compile cache location and compilation artifacts (environment variables).

- ``TORCH_NEURONX_NEFF_CACHE_DIR``: persistent cache root, shared by processes
  (default: ``$XDG_CACHE_HOME/torch_neuronx/neff`` or ``~/.cache/...``).
- ``TORCH_NEURONX_NEFF_DISABLE_CACHE=1``: no cache reads or writes; each
  process compiles into a private temporary directory.
- ``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1``: keep the FX graphs and
  generated code of every compiled graph under ``TORCH_NEURONX_DEBUG_DIR``
  (default ``./neuron_compile_artifacts``).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import threading

import torch

_tmp_lock = threading.Lock()
_private_dir: str | None = None


def _flag(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def cache_enabled() -> bool:
    return not _flag("TORCH_NEURONX_NEFF_DISABLE_CACHE")


def cache_root() -> str:
    """The persistent cache root (not created)."""
    root = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "torch_neuronx", "neff")
    return os.path.abspath(root)


def _version_tag() -> str:
    # Artifacts of one torch / torch-neuronx pair never serve another: the
    # generated code calls into both.
    from .. import __version__ as neuronx_version

    tag = f"torch-{torch.__version__}_neuronx-{neuronx_version}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", tag)


def cache_dir() -> str:
    """Directory compiled artifacts go to for this process (created)."""
    global _private_dir
    if cache_enabled():
        path = os.path.join(cache_root(), _version_tag())
        os.makedirs(path, exist_ok=True)
        return path
    with _tmp_lock:
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix="torch_neuronx_nocache_")
            atexit.register(shutil.rmtree, _private_dir, True)
        return _private_dir


def artifacts_enabled() -> bool:
    return _flag("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")


def debug_dir() -> str:
    return os.path.abspath(os.environ.get("TORCH_NEURONX_DEBUG_DIR") or "neuron_compile_artifacts")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120] or "graph"


def write_artifact(graph_name: str, filename: str, text: str) -> str | None:
    """Save one artifact of `graph_name` when artifacts are enabled; returns its path."""
    if not artifacts_enabled():
        return None
    folder = os.path.join(debug_dir(), _safe(graph_name))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, _safe(filename))
    with open(path, "w") as f:
        f.write(text)
    return path
