"""Sharded checkpoints whose index names shards that are absent (some or all of them)."""

from __future__ import annotations

import collections
import os

from . import _headers

_INDEXES = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json")
_FLOATS = ("float32", "bfloat16", "float16", "float64")


def absent(path: str, indexes=_INDEXES):
    """(the index's file name, its weight map, absent shard -> the tensors the index assigns it)
    of the first of ``indexes`` in ``path`` that names an absent shard, or None."""
    for name in indexes:
        weight_map = (_headers.read_json(os.path.join(path, name)) or {}).get("weight_map")
        if not isinstance(weight_map, dict):
            continue
        missing = collections.defaultdict(list)
        for tensor, shard in weight_map.items():
            if not os.path.isfile(os.path.join(path, shard)):
                missing[shard].append(tensor)
        if missing:
            return name, weight_map, dict(missing)
    return None


def dtype_of(present_counts, model_dtype, named: bool):
    """(the absent shards' dtype, where it came from): the one of most floating tensors in the
    first present shard that has floating tensors (each of ``present_counts``: torch dtype name ->
    tensors of it), else the config's (``named``: the config names one)."""
    import torch

    for counts in present_counts:
        floats = [(n, d) for d, n in counts.items() if d in _FLOATS]
        if floats:
            return getattr(torch, max(floats)[1]), "the shards present"
    return model_dtype, "the config" if named else None


def describe(index: str, weight_map: dict, missing: dict) -> str:
    """What the report says is absent: which of the shards the index names."""
    n = len(set(weight_map.values()))
    return f"{len(missing)} of the {n} shards {index} names ({', '.join(sorted(missing))})"


def check_known(index: str, model, state: dict, missing: dict) -> None:
    """Raise LookupError naming the tensors ``missing`` (shard -> names) that ``model``'s ``state`` lacks."""
    unknown = sorted(t for names in missing.values() for t in names if t not in state)
    if unknown:
        raise LookupError(
            f"{index} assigns tensors that {type(model).__name__}, built from config.json, does not have: "
            + ", ".join(unknown[:5])
            + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        )


def stand_in(path: str, dest: str, meta_model) -> list:
    """``dest``: ``path`` (linked) plus header-only files for its absent shards, each with the
    tensors the index assigns it, their shapes those of the model its config builds (``meta_model``)."""
    index, weight_map, missing = absent(path)
    model, model_dtype, named = meta_model(path)
    present = sorted(set(weight_map.values()) - set(missing))
    counts = (_headers.read_dtypes(os.path.join(path, shard)) for shard in present)  # read as needed
    dtype, dtype_from = dtype_of(counts, model_dtype, named)
    state = model.to(dtype).state_dict()
    check_known(index, model, state, missing)
    _headers.mirror(path, dest, skip=missing)
    nbytes = sum(
        _headers.write_file(os.path.join(dest, s), {t: state[t] for t in names}) for s, names in missing.items()
    )
    return [_headers.record(path, describe(index, weight_map, missing), model, dtype, dtype_from, nbytes)]
