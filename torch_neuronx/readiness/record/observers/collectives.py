"""Collectives: kind, dtype, bytes and group size of each c10d call."""

from __future__ import annotations

from neuronsim import collectives as _collectives
from neuronsim import settings as _settings

from ... import _torch_private
from ..measure import tensors


def collective_key(func, args, kwargs, out, dname: str, core: int, spans: dict) -> tuple:
    """The CollectiveCall key of one c10d op call (as a plain tuple: the recorder's hot path);
    `spans` keeps each group's count of instances, by group name, for one recording."""
    nbytes = _torch_private.comm_bytes(func, out, args, kwargs)
    if nbytes is None:
        nbytes = sum(t.nbytes for t in tensors(args, []))
    asynchronous = _on_side_stream(core) or _torch_private.issued_async(func, args, kwargs)
    pg = _torch_private.collective_group(func, args)
    size = pg.size() if pg is not None else 1
    return (_collectives.normalise(func.name()), dname, nbytes, size, asynchronous, _instances(pg, spans))


def _instances(pg, spans: dict) -> int:
    """How many instances (nodes: LOCAL_WORLD_SIZE ranks each, as torchrun places them) the
    group's ranks are on."""
    if pg is None:
        return 1
    n = spans.get(pg.group_name)
    if n is None:
        per_node = _settings.get("LOCAL_WORLD_SIZE")  # unset (not torchrun's): one instance
        ranks = _torch_private.group_ranks(pg)
        n = spans[pg.group_name] = len({r // per_node for r in ranks}) if per_node > 0 else 1
    return n


def _on_side_stream(core: int) -> bool:
    """Issued on a stream other than the core's default one (FSDP2 issues its all-gathers and
    reduce-scatters on their own streams, with async_op=False): compute on the default stream
    does not wait for it until an event says so."""
    import torch

    return torch.neuron.current_stream(core) != torch.neuron.default_stream(core)
