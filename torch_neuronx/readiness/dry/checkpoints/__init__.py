"""Checkpoints with shapes and no data, for dry runs of models whose weights you do not have.

``check --dry-run`` replaces each argument of the command that names a directory without its
weights by a stand-in: a temporary directory that links every file of the user's and adds
header-only safetensors files (every tensor's name, dtype and shape; no data) where weights are
absent. One module per library that claims a directory: transformers (``config.json`` with a
``model_type``), diffusers (``config.json`` with a ``_class_name``, or a pipeline's
``model_index.json``), PEFT (``adapter_config.json``), and any of them sharded with an index that
names absent shards (safetensors, or ``.bin`` stood in as safetensors). A config-only directory
none claims is reported, not replaced. What a dry run saves is written header-only the same way
(``saving``).
"""

from __future__ import annotations

import os
import shutil

from . import _bin_shards, _diffusers, _headers, _peft, _shards, _transformers
from ._transformers import header_only_checkpoint

__all__ = ["header_only_checkpoint", "note_missing_weights", "stand_ins"]

_KNOWN = (
    'transformers (a "model_type" in config.json), diffusers (a "_class_name" in config.json, or a '
    "pipeline's model_index.json) and peft (adapter_config.json)"
)


def _kind(path: str) -> str | None:
    """Which stand-in ``path`` needs: a library's, "unknown" (a config none claims), or None."""
    try:
        return _kind_of_dir(path) if os.path.isdir(path) else None
    except OSError:  # a directory it cannot read: the script's own business
        return None


def _kind_of_dir(path: str) -> str | None:
    if _diffusers.is_pipeline(path):
        return "pipeline"
    if _peft.claims(path) or _base_needs_stand_in(path):
        return "peft"
    if _shards.absent(path) is not None:
        return "shards"
    if _bin_shards.absent(path) is not None:
        return "bin-shards"
    if _headers.has_weights(path) or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    return "transformers" if _transformers.claims(path) else "diffusers" if _diffusers.claims(path) else "unknown"


def _base_needs_stand_in(path: str) -> bool:
    """An adapter with its weights whose base is a local directory without its own."""
    base = _peft.base_of(path)
    if base is None or not os.path.isdir(base) or os.path.realpath(base) == os.path.realpath(path):
        return False
    return _kind(base) not in (None, "unknown")


def _meta_model(path: str, class_name: str | None = None):
    """(model on the meta device, its dtype, whether its config named it) by the library claiming ``path``."""
    if _transformers.claims(path):
        return _transformers.meta_model(path, class_name)
    if _diffusers.claims(path):
        return _diffusers.meta_model(path)
    raise LookupError(f"{os.path.join(path, 'config.json')} names no model class of {_KNOWN}")


def _meta_base(base: str):
    """An adapter's base model on the meta device: a local directory's, or a Hub id's from its cached config."""
    return (_meta_model(base) if os.path.isdir(base) else _transformers.meta_model(base))[0]


class _Planner:
    """Stand-ins under ``root``, one per directory, and what the report says of them (``absent``)."""

    def __init__(self, root: str):
        self.root = root
        self.made: dict = {}  # real path -> stand-in directory, or None (none needed, or none possible)
        self.absent: list = []
        self._dirs = 0

    def stand_in_for(self, path: str) -> str | None:
        key = os.path.realpath(path)
        if key not in self.made:
            self.made[key] = None  # also while it is made: a PEFT adapter whose base is itself
            kind = _kind(path)
            if kind is not None:
                self._dirs += 1
                self.made[key] = self._make(path, os.path.join(self.root, f"weights-{self._dirs - 1}"), kind)
        return self.made[key]

    def _make(self, path: str, dest: str, kind: str) -> str | None:
        if kind == "unknown":
            why = f"{os.path.join(path, 'config.json')} names no model of a library a dry run knows: {_KNOWN}"
            self.absent.append(_unclaimed(path, why))
            return None
        self.absent += self._built(path, dest, kind, None)
        return dest if os.path.exists(dest) else None

    def _built(self, path: str, dest: str, kind: str, class_name: str | None) -> list:
        """The records of ``dest`` made; when none can be built, none made and the reason recorded
        (the script then gets its own directory)."""
        try:
            return self._records(path, dest, kind, class_name)
        except Exception as e:
            shutil.rmtree(dest, ignore_errors=True)
            return [_unclaimed(path, f"no stand-in could be built: {type(e).__name__}: {e}")]

    def _records(self, path: str, dest: str, kind: str, class_name: str | None) -> list:
        if kind == "pipeline":
            return _diffusers.pipeline_stand_in(path, dest, self._needs, self._component)
        if kind == "peft":
            return _peft.stand_in(path, dest, _meta_base, self._base_stand_in(path))
        if kind == "shards":
            return _shards.stand_in(path, dest, _meta_model)
        if kind == "bin-shards":
            return _bin_shards.stand_in(path, dest, _meta_model)
        if kind == "transformers":
            return _transformers.stand_in(path, dest, class_name)
        return _diffusers.stand_in(path, dest)

    @staticmethod
    def _needs(path: str) -> bool:
        return _kind(path) not in (None, "unknown", "pipeline")

    def _component(self, path: str, dest: str, class_name: str | None) -> list:
        records = self._built(path, dest, _kind(path), class_name)
        if not os.path.exists(dest):  # none could be built: the component as it is
            os.symlink(os.path.abspath(path), dest)
        return records

    def _base_stand_in(self, adapter: str) -> str | None:
        base = _peft.base_of(adapter)
        return self.stand_in_for(base) if base is not None and os.path.isdir(base) else None


def _unclaimed(path: str, reason: str) -> dict:
    return {"path": path, "absent": "config.json and no weight files", "class": None, "reason": reason}


def stand_ins(cmd: list, root: str) -> tuple[list, list]:
    """``cmd`` with each argument (``DIR`` or ``--option=DIR``) that names a directory without its
    weights replaced by a stand-in under ``root``, and what the report says of each. A dry run needs
    no weights, but the libraries refuse a directory without them before any tensor exists."""
    planner, out = _Planner(root), [cmd[0]]
    for arg in cmd[1:]:
        head, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        dest = planner.stand_in_for(value) if value else None
        out.append(head + sep + dest if dest else arg)
    return out, planner.absent


_NO_WEIGHTS_HINT = (
    "A dry run needs no weights: run the script under `torch-neuronx check --dry-run` with the "
    "directory as an argument of its command (check loads header-only weights in its place), or "
    "write them first with torch_neuronx.readiness.header_only_checkpoint(config, path)."
)


def note_missing_weights(exc: BaseException) -> None:
    """Add the dry run's way out to transformers' or diffusers' error for a directory without weights."""
    _bin_shards.note_absent_shard(exc)
    if (
        isinstance(exc, OSError)
        and str(exc).startswith("Error no file named")
        and _NO_WEIGHTS_HINT not in getattr(exc, "__notes__", ())
    ):
        exc.add_note(_NO_WEIGHTS_HINT)
