"""Safetensors files with every tensor's name, dtype and shape and no data, and the directories
around them: what a dry run loads in place of weights it does not have."""

from __future__ import annotations

import collections
import json
import os
import struct

_ST_DTYPE = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16", "torch.float64": "F64",
             "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2", "torch.int64": "I64",
             "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8",
             "torch.bool": "BOOL"}  # fmt: skip

# What the loaders read weights from; a directory with any of these has weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")


def has_weights(path: str) -> bool:
    return any(name.endswith(WEIGHT_SUFFIXES) for name in os.listdir(path))


def read_json(path: str) -> dict | None:
    """A JSON object file's contents; None when it is absent or not a JSON object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mirror(path: str, dest: str, skip=()) -> None:
    """``dest``, a directory that links every entry of ``path`` but those in ``skip`` (nothing copied)."""
    os.makedirs(dest)
    for name in os.listdir(path):
        if name not in skip:
            os.symlink(os.path.abspath(os.path.join(path, name)), os.path.join(dest, name))


# safetensors' dtype order: a file's tensors are laid out by dtype, widest first, then by name
_ST_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "F16", "BF16", "I32", "F32", "F64", "I64")
_PT = {"format": "pt"}


def write_file(path: str, tensors: dict, metadata: dict | None = _PT) -> int:
    """One safetensors file of ``tensors``' names, dtypes and shapes whose data region is a hole
    (``truncate``: no disk blocks), its header as safetensors' ``save_file`` writes it (tensors in
    its order, ``metadata`` as given); returns the bytes the data would take."""
    header, offset = ({"__metadata__": dict(metadata)} if metadata else {}), 0
    order = sorted(tensors, key=lambda k: (-_ST_ORDER.index(_ST_DTYPE[str(tensors[k].dtype)]), k))
    for name in order:
        t = tensors[name]
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPE[str(t.dtype)], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()  # byte for byte as safetensors writes it
    blob += b" " * (-len(blob) % 8)  # safetensors aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)
    return offset


def write_headers(state: dict, path: str, prefix: str = "model", shard_bytes: int = 5 << 30) -> int:
    """``state``'s names, dtypes and shapes as ``{prefix}.safetensors``, or as shards
    ``{prefix}-0000i-of-0000n.safetensors`` with their ``{prefix}.safetensors.index.json`` when
    they are over ``shard_bytes`` (as transformers and diffusers name them); the bytes the data would take."""
    shards, size = [{}], 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        return write_file(os.path.join(path, f"{prefix}.safetensors"), shards[0])
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_file(os.path.join(path, fname), shard)
        weight_map.update(dict.fromkeys(shard, fname))
    with open(os.path.join(path, f"{prefix}.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


def read_dtypes(path: str) -> collections.Counter:
    """torch dtype name -> tensors of it, in a safetensors file's header (nothing else is read)."""
    names = {v: k.removeprefix("torch.") for k, v in _ST_DTYPE.items()}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return collections.Counter(names.get(v["dtype"], v["dtype"]) for k, v in header.items() if k != "__metadata__")


def record(path: str, absent: str, model, dtype, dtype_from: str | None, nbytes: int) -> dict:
    """What the report says of one stand-in: ``model`` (or a class name) in ``dtype``, which came
    from ``dtype_from`` (None: nothing named it)."""
    return {
        "path": path,
        "absent": absent,
        "class": model if isinstance(model, str) else type(model).__name__,
        "dtype": str(dtype).removeprefix("torch."),
        "dtype_from_config": dtype_from == "the config",
        "dtype_from": dtype_from,
        "bytes": nbytes,
    }
