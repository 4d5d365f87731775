"""Collectives: kind, dtype, bytes and group size of each c10d call."""

from __future__ import annotations

from neuronsim import collectives as _collectives

from ... import _torch_private
from ..measure import tensors


def collective_key(func, args, kwargs, out, dname: str, core: int) -> tuple:
    """The CollectiveCall key of one c10d op call (as a plain tuple: the recorder's hot path)."""
    nbytes = _torch_private.comm_bytes(func, out, args, kwargs)
    if nbytes is None:
        nbytes = sum(t.nbytes for t in tensors(args, []))
    asynchronous = _on_side_stream(core) or _torch_private.issued_async(func, args, kwargs)
    pg = _torch_private.collective_group(func, args)
    return (_collectives.normalise(func.name()), dname, nbytes, pg.size() if pg is not None else 1, asynchronous)


def _on_side_stream(core: int) -> bool:
    """Issued on a stream other than the core's default one (FSDP2 issues its all-gathers and
    reduce-scatters on their own streams, with async_op=False): compute on the default stream
    does not wait for it until an event says so."""
    import torch

    return torch.neuron.current_stream(core) != torch.neuron.default_stream(core)
