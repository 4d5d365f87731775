"""Sharded pickle checkpoints (``pytorch_model.bin.index.json``) whose index names absent ``.bin`` shards.

A stand-in cannot be a ``.bin`` file without data (``torch.save`` writes checksummed zip entries),
and transformers reads one format per checkpoint, so every shard the index names stands in as a
header-only safetensors shard, under a ``model.safetensors.index.json`` that maps the same tensors:
transformers prefers it to the ``.bin`` index. A present shard's tensors keep their dtypes and shapes
(read with ``torch.load(mmap=True)``: no data read); an absent one's are the config's model's.
"""

from __future__ import annotations

import collections
import json
import os

from . import _headers, _shards

# index -> (the safetensors files that take precedence over it, the library that writes it)
_INDEXES = {
    "pytorch_model.bin.index.json": (("model.safetensors", "model.safetensors.index.json"), "transformers"),
    "diffusion_pytorch_model.bin.index.json": (
        ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"),
        "diffusers",
    ),
}
_SAFE_INDEX = "model.safetensors.index.json"


def absent(path: str):
    """(the index's file name, its weight map, absent shard -> the tensors the index assigns it),
    or None when no ``.bin`` index the loaders would read names an absent shard."""
    read = [
        name
        for name, (preferred, _) in _INDEXES.items()
        # with safetensors weights beside it, the loaders read those (or _shards stands in for them)
        if not any(os.path.isfile(os.path.join(path, p)) for p in preferred)
    ]
    return _shards.absent(path, read)


def _safe_name(shard: str) -> str:
    """The safetensors name transformers gives the shard: ``pytorch_model-00001-of-00003.bin`` ->
    ``model-00001-of-00003.safetensors``."""
    stem = shard.removesuffix(".bin")
    return ("model" + stem.removeprefix("pytorch_model") if stem.startswith("pytorch_model") else stem) + ".safetensors"


def _present_tensors(path: str, shard: str) -> dict:
    """name -> a meta tensor of the dtype and shape a present ``.bin`` shard holds (its data not read)."""
    import torch

    file = os.path.join(path, shard)
    try:
        state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:
        raise ValueError(
            f"{file} cannot be read without its data (torch.load(mmap=True, weights_only=True): {e}); "
            "a dry run stands in for the absent shards only beside .bin shards torch.save wrote in its zip "
            "format: save the checkpoint again with torch.save, or as safetensors"
        ) from e
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items() if torch.is_tensor(v)}


def _unread(path: str, what: str, reason: str) -> list:
    """The record of a directory not replaced: the script gets its own, and the report says why."""
    return [{"path": path, "absent": what, "class": None, "reason": reason}]


def _diffusers_record(path: str, what: str, index: str) -> list:
    """No stand-in: diffusers reads a ``.bin`` index only with ``use_safetensors=False``, and then no safetensors."""
    reason = (
        f"diffusers reads {index} only with from_pretrained(..., use_safetensors=False), and then reads no "
        "safetensors stand-in; add the absent shards, or save the model again as safetensors "
        "(save_pretrained's default), whose absent shards a dry run stands in for"
    )
    return _unread(path, what, reason)


def stand_in(path: str, dest: str, meta_model) -> list:
    """``dest``: ``path`` (linked) plus a header-only safetensors shard for every shard the ``.bin`` index
    names and their ``model.safetensors.index.json``; shapes of the model ``meta_model(path)`` builds."""
    index, weight_map, missing = absent(path)
    what = _shards.describe(index, weight_map, missing)
    if _INDEXES[index][1] == "diffusers":
        return _diffusers_record(path, what, index)
    # a present shard's tensors are what transformers would load from it, whatever the index says
    try:
        by_file = {_safe_name(s): _present_tensors(path, s) for s in sorted(set(weight_map.values()) - set(missing))}
    except ValueError as e:
        return _unread(path, what, f"no stand-in could be built: ValueError: {e}")
    model, model_dtype, named = meta_model(path)
    present = collections.Counter(str(t.dtype).removeprefix("torch.") for v in by_file.values() for t in v.values())
    dtype, dtype_from = _shards.dtype_of([present], model_dtype, named)
    state = model.to(dtype).state_dict()
    _shards.check_known(index, model, state, missing)
    by_file.update({_safe_name(s): {t: state[t] for t in names} for s, names in missing.items()})
    _headers.mirror(path, dest, skip=set(by_file) | {_SAFE_INDEX})
    nbytes = sum(_headers.write_file(os.path.join(dest, f), tensors) for f, tensors in sorted(by_file.items()))
    safe_map = {t: f for f, tensors in by_file.items() for t in tensors}
    with open(os.path.join(dest, _SAFE_INDEX), "w") as f:
        json.dump({"metadata": {"total_size": nbytes}, "weight_map": safe_map}, f)
    what += f"; every shard stood in as header-only safetensors under {_SAFE_INDEX}, with the same tensors"
    return [_headers.record(path, what, model, dtype, dtype_from, nbytes)]


_ABSENT_SHARD_HINT = (
    "A dry run needs no weights: with the directory as an argument of the command of `torch-neuronx check "
    "--dry-run`, transformers loads header-only safetensors in place of the absent .bin shards its "
    "pytorch_model.bin.index.json names, unless from_pretrained is given use_safetensors=False (leave it out)."
)


def note_absent_shard(exc: BaseException) -> None:
    """Add the dry run's way out to the error for a ``.bin`` shard that an index names and that is absent."""
    name = getattr(exc, "filename", None)
    if not (isinstance(exc, FileNotFoundError) and isinstance(name, str) and name.endswith(".bin")):
        return
    if os.path.isfile(os.path.join(os.path.dirname(name), "pytorch_model.bin.index.json")):
        if _ABSENT_SHARD_HINT not in getattr(exc, "__notes__", ()):
            exc.add_note(_ABSENT_SHARD_HINT)
