"""Collectives: kind, dtype, bytes and group size of each c10d call."""

from __future__ import annotations

from .._cost import tensors


def group_size(func, args) -> int:
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        return CollectiveOp.get_process_group(func, args).size()
    except Exception:
        return 1


def collective_key(func, args, kwargs, out, dname: str, core: int) -> tuple:
    """The CollectiveCall key of one c10d op call (as a plain tuple: the recorder's hot path)."""
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        nbytes = int(CollectiveOp.get_comm_tensor_size(func, out, args, kwargs))
    except Exception:
        nbytes = sum(t.nbytes for t in tensors(args, []))
    asynchronous = _on_side_stream(core) or _async_op(func, args, kwargs)
    return (collective_name(func.name()), dname, nbytes, group_size(func, args), asynchronous)


def _on_side_stream(core: int) -> bool:
    """Issued on a stream other than the core's default one (FSDP2 issues its all-gathers and
    reduce-scatters on their own streams, with async_op=False): compute on the default stream
    does not wait for it until an event says so."""
    import torch

    return torch.neuron.current_stream(core) != torch.neuron.default_stream(core)


def _async_op(func, args, kwargs) -> bool:
    """Whether a c10d op was issued with ``async_op=True`` (functional collectives: False)."""
    if not func.name().startswith("c10d::"):
        return False
    for i, a in enumerate(func._schema.arguments):
        if a.name == "async_op":
            if a.name in kwargs:
                return bool(kwargs[a.name])
            return bool(args[i]) if i < len(args) else bool(a.default_value)
    return False


def collective_name(name: str) -> str:
    """``c10d::allreduce_`` -> ``allreduce``: the op without namespace, overload and underscores."""
    return name.split("::")[1].split(".")[0].strip("_")
