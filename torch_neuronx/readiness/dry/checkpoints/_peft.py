"""PEFT adapter directories without weights: an ``adapter_config.json`` and no ``adapter_model``."""

from __future__ import annotations

import collections
import json
import os

from . import _headers

_CONFIG = "adapter_config.json"


def claims(path: str) -> bool:
    """An adapter's config without the adapter's weights (safetensors or bin)."""
    names = os.listdir(path)
    return _CONFIG in names and not any(n.startswith("adapter_model.") for n in names)


def base_of(path: str) -> str | None:
    """The base model an adapter directory's config names (None: not an adapter's directory)."""
    base = (_headers.read_json(os.path.join(path, _CONFIG)) or {}).get("base_model_name_or_path")
    return base if isinstance(base, str) else None


def stand_in(path: str, dest: str, meta_base, base_dest: str | None) -> list:
    """``dest``: ``path`` (linked) plus, without its weights, a header-only ``adapter_model.safetensors``
    of the adapter PEFT builds on the base model's shapes (``meta_base(base)``: the base on the meta
    device, from its config alone). With ``base_dest`` (the base's own stand-in), the config names it."""
    _headers.mirror(path, dest, skip={_CONFIG} if base_dest else ())
    if base_dest:  # the base as the dry run loads it: its stand-in
        with open(os.path.join(path, _CONFIG)) as f:
            data = json.load(f)
        data["base_model_name_or_path"] = base_dest
        with open(os.path.join(dest, _CONFIG), "w") as f:
            json.dump(data, f)
    if not claims(path):  # the adapter's weights are there: only its base stood in
        return []
    import peft
    import torch

    config = peft.PeftConfig.from_pretrained(path)
    base_model = meta_base(config.base_model_name_or_path)
    with torch.device("meta"):
        model = peft.get_peft_model(base_model, config)
    state = peft.get_peft_model_state_dict(model)
    nbytes = _headers.write_file(os.path.join(dest, "adapter_model.safetensors"), state)
    dtype = collections.Counter(t.dtype for t in state.values()).most_common(1)[0][0]
    name = f"{config.peft_type.value} adapter of {type(base_model).__name__}"
    return [_headers.record(path, f"{_CONFIG} and no adapter weights", name, dtype, "PEFT's adapter", nbytes)]
