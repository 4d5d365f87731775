"""Saving in a dry run: safetensors files of tensors without data are written header-only, and
``torch.save``'s are not written.

A dry run's tensors have no data, so safetensors cannot write them. Where the real run writes a
file, the dry run writes the same file without its data (``_headers.write_file``: the header
byte for byte as safetensors writes it, the data region a hole), so the directory, the file
names, an index's ``total_size`` and every header match the real run's, and lists each file in
the report. It is the one place safetensors serializes a dict of tensors to a file
(``save_file``; ``save_model`` and transformers' ``save_pretrained`` call it, each shard
once), whatever name a library imported ``save_file`` under.

``torch.save`` pickles the data itself, which a dry run does not have: its file is not written,
the report lists it as such, and the run goes on to its verdict; a later ``torch.load`` of that
file is where the run stops, naming both lines.
"""

from __future__ import annotations

import os

import torch

from ...._sites import frame_site, in_library, user_frame
from ... import _torch_private as _tp
from ..reads import ValueUnknownError
from . import _headers


class _HeaderOnly:
    """safetensors' flattened tensors of a dict that holds fake ones: the tensors themselves."""

    def __init__(self, tensors: dict):
        self.tensors = tensors


def _has_fakes(tensors) -> bool:
    return isinstance(tensors, dict) and any(isinstance(t, _tp.FakeTensor) for t in tensors.values())


def _script_site() -> str:
    """The script's line that saved (through the libraries' frames), else the innermost caller's."""
    f = first = user_frame()
    while f is not None and in_library(f.f_code.co_filename):
        f = f.f_back
    return frame_site(f if f is not None else first)


class SaveTap:
    """Replaces two functions of ``safetensors.torch`` for the dry run only: ``_flatten_as_ptr``
    (it checks the tensors, then reads their data) and ``serialize_file`` (it writes the file).
    ``on_saved(record)`` is told of each file written without data."""

    def __init__(self, on_saved):
        self._on_saved = on_saved
        self._orig: dict = {}

    def install(self) -> None:
        try:
            import safetensors.torch as st
        except ImportError:  # nothing saves safetensors files
            return
        names = ("_flatten_as_ptr", "serialize_file", "serialize")
        self._orig = {n: getattr(st, n) for n in names}
        st._flatten_as_ptr, st.serialize_file, st.serialize = self._flatten, self._serialize_file, self._serialize

    def remove(self) -> None:
        if self._orig:
            import safetensors.torch as st

            for name, orig in self._orig.items():
                setattr(st, name, orig)
            self._orig = {}

    def _flatten(self, tensors, keep_alive):
        if not _has_fakes(tensors):
            return self._orig["_flatten_as_ptr"](tensors, keep_alive)
        import safetensors.torch as st

        st._evaluate_tensors_for_save(tensors)  # safetensors' own checks: shared, sparse tensors
        for name, t in tensors.items():
            if not t.is_contiguous():  # as safetensors refuses it
                raise ValueError(f"You are trying to save a non contiguous tensor: `{name}` which is not allowed.")
        return _HeaderOnly(tensors)

    def _serialize_file(self, flat, filename, metadata=None):
        if not isinstance(flat, _HeaderOnly):
            return self._orig["serialize_file"](flat, filename, metadata=metadata)
        nbytes = _headers.write_file(os.fspath(filename), flat.tensors, metadata)
        self._on_saved(
            {"path": os.path.abspath(filename), "tensors": len(flat.tensors), "bytes": nbytes, "site": _script_site()}
        )

    def _serialize(self, flat, metadata=None):
        if not isinstance(flat, _HeaderOnly):
            return self._orig["serialize"](flat, metadata=metadata)
        raise ValueUnknownError(
            f"dry run: safetensors.torch.save at {_script_site()} returns the bytes of tensors, which a dry run "
            "does not have. Save to a file (safetensors.torch.save_file: a dry run writes it without data), or "
            "run without --dry-run."
        )


class Unwritten:
    """The files ``torch.save`` did not write in this dry run, each with the script's line that
    saved it: a path by its real path, a file object by identity (held for the run)."""

    def __init__(self):
        self._paths: dict = {}
        self._objects: dict = {}  # id -> (file object, site): the object is held, so its id stays its own

    @staticmethod
    def _path(f) -> str | None:
        return os.path.realpath(os.fsdecode(os.fspath(f))) if isinstance(f, (str, bytes, os.PathLike)) else None

    def add(self, f, site: str) -> None:
        path = self._path(f)
        if path is None:
            self._objects[id(f)] = (f, site)
        else:
            self._paths[path] = site

    def written(self, f) -> None:
        """A later save wrote `f` for real: loading it reads that file."""
        path = self._path(f)
        if path is None:
            self._objects.pop(id(f), None)
        else:
            self._paths.pop(path, None)

    def site(self, f) -> str | None:
        """The line whose save of `f` was not written, or None when it was not one of them."""
        path = self._path(f)
        if path is not None:
            return self._paths.get(path)
        entry = self._objects.get(id(f))
        return entry[1] if entry is not None and entry[0] is f else None

    def note(self, exc: BaseException) -> None:
        """A FileNotFoundError for a file torch.save did not write (the script opened it itself) says so."""
        filename = getattr(exc, "filename", None)
        site = self.site(filename) if isinstance(exc, FileNotFoundError) and filename else None
        if site is not None:
            exc.add_note(
                f"dry run: torch.save at {site} did not write this file (a dry run has no tensor values to "
                "pickle). Run without --dry-run to load it, or skip this load in a dry run."
            )


def _describe(f) -> str:
    """What a save went to, as the report lists it: a path, or what the file object is."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(os.fspath(f)))
    name = getattr(f, "name", None)
    if isinstance(name, str) and name:
        return f"{os.path.abspath(name)} (an open {type(f).__name__})"
    return f"a {type(f).__module__}.{type(f).__name__} object"


def _tensor_leaves(obj) -> list:
    """The tensors among ``obj``'s leaves (dicts, lists, tuples: a state_dict, an optimizer's state)."""
    return [t for t in _tp.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _without_data(t: torch.Tensor) -> bool:
    """A dry run's tensor: a fake one, or a DTensor whose local shard is (what torch.save pickles)."""
    return isinstance(_tp.local(t), _tp.FakeTensor)


def _data_bytes(tensors: list) -> int:
    """The bytes of the storages a pickle of `tensors` holds: each storage once, as torch.save writes it."""
    storages = {}
    for t in tensors:
        try:
            key, st = _tp.storage_key(_tp.local(t))
            storages[key] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # a wrapper subclass without a storage of its own
            storages[id(t)] = t.nbytes
    return sum(storages.values())


class TorchSaveTap(_tp.AttributeTap):
    """Skips ``torch.save`` of a dry run's tensors (a ``state_dict``, an optimizer's state), and the
    run goes on: its pickle holds the data, which a dry run does not have (PyTorch's own error there
    is about pickling the fake tensor mode). ``on_saved(record)`` is told of each file not written
    (``"written": False``); `unwritten` remembers it, so that a later ``torch.load`` of it stops
    there (:class:`TorchLoadTap`). Objects without a dry run's tensors are saved as in a real run."""

    _owner, _name = torch, "save"

    def __init__(self, on_saved, unwritten: Unwritten):
        self._on_saved = on_saved
        self._unwritten = unwritten

    def _replacement(self):
        orig = torch.save

        def save(obj, f, *args, **kwargs):
            tensors = _tensor_leaves(obj)
            if not any(_without_data(t) for t in tensors):
                out = orig(obj, f, *args, **kwargs)
                self._unwritten.written(f)
                return out
            site = _script_site()
            self._unwritten.add(f, site)
            self._on_saved(
                {"path": _describe(f), "tensors": len(tensors), "bytes": _data_bytes(tensors), "site": site,
                 "written": False}
            )  # fmt: skip
            return None

        return save


class TorchLoadTap(_tp.AttributeTap):
    """Stops ``torch.load`` of a file this dry run's ``torch.save`` did not write, with
    ``ValueUnknownError`` naming both lines: what it would load is the data a dry run does not
    have (and a file at that path, if any, is not what the script saved). Other files load as in a
    real run."""

    _owner, _name = torch, "load"

    def __init__(self, unwritten: Unwritten):
        self._unwritten = unwritten

    def _replacement(self):
        orig = torch.load

        def load(f, *args, **kwargs):
            saved_at = self._unwritten.site(f)
            if saved_at is not None:
                raise ValueUnknownError(
                    f"dry run: torch.load at {_script_site()} reads {_describe(f)}, which torch.save at {saved_at} "
                    "did not write: a dry run has no tensor values to pickle. Run without --dry-run to load it, "
                    "skip this load in a dry run, or save with safetensors (save_file, save_pretrained: a dry run "
                    "writes those files without data and loads them)."
                )
            return orig(f, *args, **kwargs)

        return load
