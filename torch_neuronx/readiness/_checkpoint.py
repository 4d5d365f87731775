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
    shards, current, size = [], {}, 0
    for name, t in model.state_dict().items():
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
