"""Transformers model directories: header-only checkpoints of a config, and stand-ins for a
directory with a ``config.json`` (naming a ``model_type``) and no weights."""

from __future__ import annotations

import os

from . import _headers


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
    return _headers.write_headers(model.state_dict(), path, shard_bytes=shard_bytes)


def claims(path: str) -> bool:
    """A transformers ``config.json``: it names a ``model_type``."""
    return "model_type" in (_headers.read_json(os.path.join(path, "config.json")) or {})


def meta_model(path: str, class_name: str | None = None):
    """(the model of ``path``'s config on the meta device, its dtype, whether the config named it).
    The class is ``class_name``, else the one save_pretrained recorded (``architectures``), else a
    causal LM's, as header_only_checkpoint writes it."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    arch = class_name or next(iter(getattr(config, "architectures", None) or []), None)
    cls = getattr(transformers, arch, None) if arch else None
    named = isinstance(getattr(config, "dtype", None), torch.dtype)
    dtype = config.dtype if named else torch.float32  # save_pretrained's dtype when a config names none
    with torch.device("meta"):
        model = cls(config) if cls is not None else transformers.AutoModelForCausalLM.from_config(config)
    return model.to(dtype), dtype, named


def stand_in(path: str, dest: str, class_name: str | None = None) -> list:
    """``dest``: ``path`` (every entry linked) plus header-only weights for its config."""
    model, dtype, named = meta_model(path, class_name)
    _headers.mirror(path, dest)
    nbytes = _headers.write_headers(model.state_dict(), dest)
    return [
        _headers.record(path, "config.json and no weight files", model, dtype, "the config" if named else None, nbytes)
    ]
