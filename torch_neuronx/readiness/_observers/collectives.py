"""Collectives: kind, dtype, bytes and group size of each c10d call."""

from __future__ import annotations

from .._cost import tensors


def group_size(func, args) -> int:
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        return CollectiveOp.get_process_group(func, args).size()
    except Exception:
        return 1


def collective_key(func, args, kwargs, out, dname: str) -> tuple:
    """The CollectiveCall key of one c10d op call (as a plain tuple: the recorder's hot path)."""
    from torch.distributed._tools.fake_collectives import CollectiveOp

    try:
        nbytes = int(CollectiveOp.get_comm_tensor_size(func, out, args, kwargs))
    except Exception:
        nbytes = sum(t.nbytes for t in tensors(args, []))
    return (collective_name(func.name()), dname, nbytes, group_size(func, args))


def collective_name(name: str) -> str:
    """``c10d::allreduce_`` -> ``allreduce``: the op without namespace, overload and underscores."""
    return name.split("::")[1].split(".")[0].strip("_")
