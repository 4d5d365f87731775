"""Checkpoints with shapes and no data, for dry runs of models whose weights you do not have."""

from __future__ import annotations

import json
import os
import struct

_ST_DTYPE = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16", "torch.float8_e4m3fn": "F8_E4M3"}


def header_only_checkpoint(config, path: str, dtype=None, shard_bytes: int = 5 << 30) -> int:
    """Write ``config`` (a transformers ``PretrainedConfig``) and safetensors files that hold
    every weight's name, dtype and shape but no data to ``path``; returns the bytes the
    weights would take.

    The data region of each file is a hole (``truncate``): no disk blocks, so ``from_pretrained
    (path)`` of a 405B model costs no disk here, and a dry run reads none of it (with a
    tensor-parallel plan too). Outside a dry run the weights read as zeros.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.bfloat16)
    os.makedirs(path, exist_ok=True)
    config.architectures = [type(model).__name__]  # as save_pretrained of the model records it
    config.save_pretrained(path)
    return _write_headers(model.state_dict(), path, shard_bytes)


def _write_headers(state: dict, path: str, shard_bytes: int = 5 << 30) -> int:
    """Sharded safetensors files of ``state``'s names, dtypes and shapes, data regions holes."""
    shards, current, size = [], {}, 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += nbytes
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, t in shard.items():
            n = t.numel() * t.element_size()
            header[name] = {
                "dtype": _ST_DTYPE[str(t.dtype)],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + n],
            }
            offset += n
            weight_map[name] = fname
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)  # safetensors aligns the data to 8 bytes
        with open(os.path.join(path, fname), "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            f.truncate(8 + len(blob) + offset)
        total += offset
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


# What transformers and the other loaders read weights from; a directory with any of these has weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".index.json")


def _config_only(path: str) -> bool:
    """A directory with a transformers ``config.json`` (it names a ``model_type``) and no weight file."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isdir(path) or not os.path.isfile(cfg):
        return False
    if any(name.endswith(_WEIGHT_SUFFIXES) for name in os.listdir(path)):
        return False
    try:
        with open(cfg) as f:
            return "model_type" in json.load(f)
    except (OSError, ValueError):
        return False


def _stand_in(path: str, dest: str) -> dict:
    """A directory at ``dest`` that is ``path`` (every entry linked, nothing copied) plus
    header-only weights for its config: what ``from_pretrained(dest)`` loads in a dry run."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    # The model class save_pretrained recorded; a config without one is a causal LM's, as
    # header_only_checkpoint writes it.
    arch = next(iter(getattr(config, "architectures", None) or []), None)
    cls = getattr(transformers, arch, None) if arch else None
    named = isinstance(getattr(config, "dtype", None), torch.dtype)
    dtype = config.dtype if named else torch.float32  # save_pretrained's dtype when a config names none
    with torch.device("meta"):
        model = cls(config) if cls is not None else transformers.AutoModelForCausalLM.from_config(config)
    os.makedirs(dest)
    for name in os.listdir(path):
        os.symlink(os.path.abspath(os.path.join(path, name)), os.path.join(dest, name))
    nbytes = _write_headers(model.to(dtype).state_dict(), dest)
    return {
        "path": path,
        "class": type(model).__name__,
        "dtype": str(dtype).removeprefix("torch."),
        "dtype_from_config": named,
        "bytes": nbytes,
    }


def _stand_ins(cmd: list, root: str) -> tuple[list, list]:
    """``cmd`` with each argument (``DIR`` or ``--option=DIR``) that names a config-only
    directory replaced by a stand-in under ``root``, and what was replaced. A dry run needs
    no weights, but transformers refuses a directory without them before any tensor exists."""
    out, absent, made = [cmd[0]], [], {}
    for arg in cmd[1:]:
        head, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if value and _config_only(value):
            key = os.path.realpath(value)
            if key not in made:
                made[key] = os.path.join(root, f"weights-{len(made)}")
                absent.append(_stand_in(value, made[key]))
            arg = head + sep + made[key]
        out.append(arg)
    return out, absent


_NO_WEIGHTS_HINT = (
    "A dry run needs no weights: run the script under `torch-neuronx check --dry-run` with the "
    "directory as an argument of its command (check loads header-only weights in its place), or "
    "write them first with torch_neuronx.readiness.header_only_checkpoint(config, path)."
)


def _note_missing_weights(exc: BaseException) -> None:
    """Add the dry run's way out to transformers' error for a directory without weights."""
    if (
        isinstance(exc, OSError)
        and str(exc).startswith("Error no file named")
        and _NO_WEIGHTS_HINT not in getattr(exc, "__notes__", ())
    ):
        exc.add_note(_NO_WEIGHTS_HINT)
