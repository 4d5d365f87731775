"""Diffusers directories without weights: a model's (``config.json`` naming a ``_class_name``)
and a pipeline's (``model_index.json`` and a sub-folder per component)."""

from __future__ import annotations

import os

from . import _headers

_WEIGHTS = "diffusion_pytorch_model"  # diffusers' file name for a model's weights


def claims(path: str) -> bool:
    """A diffusers model's ``config.json``: it names a ``_class_name``."""
    return "_class_name" in (_headers.read_json(os.path.join(path, "config.json")) or {})


def meta_model(path: str):
    """(the model of ``path``'s config built on the meta device by its diffusers class, its dtype,
    False): diffusers' configs name no dtype, and save_pretrained keeps the model's, float32 by default."""
    import diffusers
    import torch

    name = _headers.read_json(os.path.join(path, "config.json"))["_class_name"]
    cls = getattr(diffusers, name, None)
    if cls is None:
        raise LookupError(f"diffusers {diffusers.__version__} has no model class {name!r}")
    from diffusers.models.modeling_utils import no_init_weights

    with torch.device("meta"), no_init_weights():
        model = cls.from_config(cls.load_config(path))
    return model, torch.float32, False


def stand_in(path: str, dest: str) -> list:
    """``dest``: ``path`` (every entry linked) plus header-only ``diffusion_pytorch_model`` weights."""
    model, dtype, named = meta_model(path)
    _headers.mirror(path, dest)
    nbytes = _headers.write_headers(model.state_dict(), dest, prefix=_WEIGHTS)
    return [
        _headers.record(path, "config.json and no weight files", model, dtype, "the config" if named else None, nbytes)
    ]


def is_pipeline(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "model_index.json"))


def pipeline_stand_in(path: str, dest: str, needs, plan) -> list:
    """``dest``: the pipeline ``path`` with each component sub-folder that ``needs`` a stand-in
    (no weights, or shards its index names absent) replaced by one (``plan(sub, sub_dest,
    class_name)``); the others, tokenizers and schedulers linked as they are. No record (nothing
    made) when every component has its weights."""
    index = _headers.read_json(os.path.join(path, "model_index.json")) or {}
    lacking = {
        k: v
        for k, v in index.items()
        if isinstance(v, list) and len(v) == 2 and os.path.isdir(os.path.join(path, k)) and needs(os.path.join(path, k))
    }
    if not lacking:
        return []
    _headers.mirror(path, dest, skip=lacking)
    out = []
    for sub, (library, class_name) in lacking.items():
        out += plan(os.path.join(path, sub), os.path.join(dest, sub), class_name if library == "transformers" else None)
    return out
