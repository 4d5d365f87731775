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
import warnings

import torch

from neuronsim import settings as _settings

_tmp_lock = threading.Lock()
_private_dir: str | None = None
PRIVATE_DIR_PREFIX = "torch_neuronx_nocache_"  # the temporary directory when nothing persists


def cache_enabled() -> bool:
    return not _settings.get("TORCH_NEURONX_NEFF_DISABLE_CACHE")


def cache_root() -> str:
    """The persistent cache root (not created)."""
    root = _settings.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    if not root:
        base = _settings.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "torch_neuronx", "neff")
    return os.path.abspath(root)


def _version_tag() -> str:
    # Artifacts of one torch / torch-neuronx pair never serve another: the
    # generated code calls into both.
    from .. import __version__ as neuronx_version

    tag = f"torch-{torch.__version__}_neuronx-{neuronx_version}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", tag)


def cache_dir() -> str:
    """Directory compiled artifacts go to for this process (created).

    An unusable persistent cache (read-only, or not a directory) is reported
    once and replaced by a private temporary directory: graphs still compile,
    nothing is persisted.
    """
    global _private_dir
    if cache_enabled():
        path = os.path.join(cache_root(), _version_tag())
        problem = _unwritable(path)
        if problem is None:
            return path
        if path not in _warned_unwritable:
            _warned_unwritable.add(path)
            warnings.warn(
                f"torch.compile backend 'neuron': the compile cache {path} is not writable "
                f"({problem}); compiling without persisting. Point TORCH_NEURONX_NEFF_CACHE_DIR at a "
                f"writable directory, or set TORCH_NEURONX_NEFF_DISABLE_CACHE=1 to silence this.",
                stacklevel=3,
            )
    with _tmp_lock:
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix=PRIVATE_DIR_PREFIX)
            atexit.register(shutil.rmtree, _private_dir, True)
        return _private_dir


def persistent() -> bool:
    """True when compiled graphs are stored in (and loaded from) the persistent cache."""
    return cache_enabled() and _unwritable(os.path.join(cache_root(), _version_tag())) is None


_writable_checked: dict = {}
_warned_unwritable: set = set()


def _unwritable(path: str) -> str | None:
    """Why `path` cannot hold cache entries (None: it can), checked once per process.

    Root ignores permission bits, so only a real write tells (read-only mounts,
    immutable directories, a regular file in the path).
    """
    if path not in _writable_checked:
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".probe_"):
                pass
            _writable_checked[path] = None
        except OSError as e:
            _writable_checked[path] = f"{type(e).__name__}: {e.strerror or e}"
    return _writable_checked[path]


# --------------------------------------------------------------------------- #
# Integrity of cache entries
# --------------------------------------------------------------------------- #
# Inductor loads its cache entries (pickled graphs, generated code, kernel
# libraries) without checking them. Every entry a compile of ours writes gets a
# record (size, mtime, sha256, model name) under neuron_index/; before a
# process first uses the cache, entries whose record no longer matches, and
# graph entries nobody recorded, are deleted so they are recompiled.

_INDEX = "neuron_index"
_UNINDEXED = {"locks", _INDEX}
_GRAPH_DIRS = ("fxgraph", "aotautograd")
_verified: set = set()


def _entries(root: str):
    for d, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(d, root)
        if rel_dir == ".":
            dirs[:] = [x for x in dirs if x not in _UNINDEXED]
        for f in files:
            if f.endswith(".tmp") or f.startswith(".probe_"):
                continue  # another process's write in progress
            yield os.path.normpath(os.path.join(rel_dir, f))


def _record_path(root: str, rel: str) -> str:
    return os.path.join(root, _INDEX, rel + ".json")


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_entries(model_name: str) -> None:
    """Record every unrecorded entry of the persistent cache as written by `model_name`."""
    if not persistent():
        return
    import json

    root = cache_dir()
    for rel in _entries(root):
        rec = _record_path(root, rel)
        if os.path.exists(rec):
            continue
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
            data = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path), "model": model_name}
            os.makedirs(os.path.dirname(rec), exist_ok=True)
            tmp = f"{rec}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, rec)
        except OSError:
            continue  # removed meanwhile by another process: nothing to vouch for


def verify_entries() -> list:
    """Delete corrupted entries of the persistent cache (once per process); returns their paths."""
    if not persistent():
        return []
    root = cache_dir()
    with _tmp_lock:
        if root in _verified:
            return []
        _verified.add(root)
    discarded = []
    for rel in list(_entries(root)):
        problem = _entry_problem(root, rel)
        if problem is None:
            continue
        for path in (os.path.join(root, rel), _record_path(root, rel)):
            try:
                os.remove(path)
            except OSError:
                pass
        discarded.append(f"{rel} ({problem})")
    return discarded


def _entry_problem(root: str, rel: str) -> str | None:
    import json

    path = os.path.join(root, rel)
    try:
        with open(_record_path(root, rel)) as f:
            rec = json.load(f)
    except FileNotFoundError:
        rec = None
    except (OSError, ValueError):
        return "unreadable integrity record"
    try:
        st = os.stat(path)
    except OSError:
        return None  # gone meanwhile
    if rec is None:
        if rel.split(os.sep, 1)[0] in _GRAPH_DIRS:
            return "not written by a neuron compile"
        if rel.endswith(".so"):
            return _elf_problem(path, st.st_size)
        return None
    if st.st_size != rec.get("size"):
        return f"size {st.st_size} != recorded {rec.get('size')}"
    if st.st_mtime_ns != rec.get("mtime_ns") and _sha256(path) != rec.get("sha256"):
        return "content changed since it was written"
    return None


def _elf_problem(path: str, size: int) -> str | None:
    # An unrecorded kernel library: its ELF header must be whole and its section
    # table inside the file (a truncated library fails only when loaded).
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        return "not a 64-bit ELF library"
    (shoff,) = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    if shoff + shentsize * shnum > size:
        return "truncated ELF library"
    return None


def artifacts_enabled() -> bool:
    return _settings.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")


def debug_dir() -> str:
    return os.path.abspath(_settings.get("TORCH_NEURONX_DEBUG_DIR"))


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
