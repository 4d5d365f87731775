"""Saving in a dry run: safetensors files of tensors without data are written header-only.

A dry run's tensors have no data, so safetensors cannot write them. Where the real run writes a
file, the dry run writes the same file without its data (``_headers.write_file``: the header
byte for byte as safetensors writes it, the data region a hole), so the directory, the file
names, an index's ``total_size`` and every header match the real run's, and lists each file in
the report. It is the one place safetensors serializes a dict of tensors to a file
(``save_file``; ``save_model`` and transformers' ``save_pretrained`` call it, each shard
once), whatever name a library imported ``save_file`` under.
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


class TorchSaveTap(_tp.AttributeTap):
    """Stops ``torch.save`` of a dry run's tensors (a ``state_dict``, an optimizer's state) with
    ``ValueUnknownError`` at the script's line, before it writes anything: its pickle holds the
    data, which a dry run does not have (PyTorch's own error there is about pickling the fake
    tensor mode). Objects without fake tensors are saved as in a real run."""

    _owner, _name = torch, "save"

    def _replacement(self):
        orig = torch.save

        def save(obj, f, *args, **kwargs):
            if _holds_fakes(obj):
                raise ValueUnknownError(
                    f"dry run: torch.save at {_script_site()} of tensors without data: a dry run does not have "
                    "the values it would pickle. Save with safetensors (save_file, or save_pretrained: a dry run "
                    "writes the files without data), skip this save in a dry run, or run without --dry-run."
                )
            return orig(obj, f, *args, **kwargs)

        return save


def _holds_fakes(obj) -> bool:
    """A fake tensor among ``obj``'s leaves (dicts, lists, tuples: a state_dict, an optimizer's state)."""
    return any(isinstance(t, _tp.FakeTensor) for t in _tp.tree_leaves(obj))
