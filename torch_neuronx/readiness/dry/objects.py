"""Object collectives in a dry run: ``all_gather_object``, ``gather_object``,
``broadcast_object_list`` and ``scatter_object_list`` under the dry run's value rule.

c10d pickles each object into a byte tensor and exchanges the bytes in two collectives (the
sizes, then the data). In a dry run every rank's object is taken to be this rank's, as every
rank's tensor is (``collective_values``): an all-gather or gather gives this rank's object from every rank,
a broadcast leaves this rank's list as it is and a scatter gives this rank its own share. A rank
other than the source pickles nothing in a real broadcast or scatter, so here it issues them as
their source, with its own objects: the same collectives, in the same order, as in a real run.
Their byte counts follow this rank's objects, so ranks compare them by op and order only
(``active()`` names the object collective running). Each call is listed in the report among the
assumed collectives, once, at the script's line.

``send_object_list`` and ``recv_object_list`` are not assumed: the receiver has no object of its
own to take. The sender's pickled objects go to the receiver (``mailbox``), and each side issues the
collectives a real run issues, with the real byte counts. A receive whose sender does not run in
this dry run, or never sends, stops with :class:`ValueUnknownError` at its line.
"""

from __future__ import annotations

import functools
import threading

from ..._sites import user_site
from .. import _torch_private as _tp
from . import mailbox
from .reads import ValueUnknownError

_NAMES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list")
_P2P_NAMES = ("send_object_list", "recv_object_list")
_running = threading.local()


def active() -> str | None:
    """The object collective this thread is in (its c10d collectives are its parts), else None."""
    return getattr(_running, "name", None)


def _group_rank(group) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def _as_source(name: str, orig, args: tuple, kwargs: dict) -> tuple:
    """The call with this rank as its source (``group_src``), as the rule reads it."""
    import inspect

    bound = inspect.signature(orig).bind(*args, **kwargs)
    bound.arguments.pop("src", None)
    bound.arguments["group_src"] = _group_rank(bound.arguments.get("group"))
    if name == "scatter_object_list" and bound.arguments.get("scatter_object_input_list") is None:
        raise ValueUnknownError(
            f"dry run: scatter_object_list at {user_site()} on a rank other than its source: the object this "
            "rank receives is not known in a dry run (the rule that every rank holds this rank's values gives "
            "none, as this rank passes no input list). Pass the same input list on every rank, or run without "
            "--dry-run."
        )
    return bound.args, bound.kwargs


def _arguments(orig, args: tuple, kwargs: dict) -> dict:
    import inspect

    bound = inspect.signature(orig).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _send_objects(orig, args: tuple, kwargs: dict):
    """Leaves the objects for the receiver, then sends them as a real run does."""
    import torch.distributed as dist

    a = _arguments(orig, args, kwargs)
    group = _tp.group_or_default(a["group"])
    if _tp.in_group(group):
        dst = dist.get_global_rank(group, _tp.group_rank_of(group, a["dst"], a["group_dst"]))
        mailbox.send("objects", group.group_name, dist.get_rank(), dst, mailbox.pickle_objects(a["object_list"]))
    return orig(*args, **kwargs)


def _received(a: dict, group, src: int) -> tuple:
    """The objects `src` sent to this rank (its next message), or ValueUnknownError."""
    import torch.distributed as dist

    payload, why = mailbox.receive("objects", group.group_name, src, dist.get_rank(), mailbox.TIMEOUT)
    if payload is None:
        reason, fix = mailbox.explain(why, src)
        raise ValueUnknownError(
            f"dry run: recv_object_list at {user_site()} receives rank {src}'s objects, and {reason}: the "
            f"receiver has no objects of its own to take for them. {fix}, or run without --dry-run."
        )
    objects, sizes = mailbox.unpickle_objects(payload)
    if len(objects) != len(a["object_list"]):
        raise ValueError(
            f"recv_object_list at {user_site()}: rank {src} sent {len(objects)} object(s) into a list of "
            f"{len(a['object_list'])}; pass a list of the length the sender sends"
        )
    return objects, sizes


def _recv_objects(orig, args: tuple, kwargs: dict):
    """The sender's objects, after the collectives a real run issues to receive them."""
    import torch
    import torch.distributed as dist

    a = _arguments(orig, args, kwargs)
    group = _tp.group_or_default(a["group"])
    if not _tp.in_group(group) or (a["src"] is None and a["group_src"] is None):
        return orig(*args, **kwargs)  # not a member; or from any rank, which c10d refuses as it would
    group_src = _tp.group_rank_of(group, a["src"], a["group_src"])
    src = dist.get_global_rank(group, group_src)
    objects, sizes = _received(a, group, src)
    device = a["device"] or _tp.object_collective_device(group)
    for t in (torch.empty(len(sizes), dtype=torch.long, device=device),
              torch.empty(sum(sizes), dtype=torch.uint8, device=device)):  # fmt: skip
        if a["use_batch"]:
            dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, group_peer=group_src, group=group)]).pop().wait()
        else:
            dist.recv(t, group=group, group_src=group_src)
    a["object_list"][:] = objects
    return src


class ObjectCollectivesTap:
    """Replaces the object collectives in ``torch.distributed`` for the dry run only."""

    def __init__(self, assume):
        self._assume = assume  # ValueStore.assume: lists a collective the value rule answered
        self._orig: dict = {}

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_available():
            return
        for name in _NAMES + _P2P_NAMES:
            orig = self._orig[name] = getattr(c10d, name)
            wrapped = self._wrap(name, orig)
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)

    def remove(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, orig in self._orig.items():
            setattr(c10d, name, orig)
            setattr(dist, name, orig)
        self._orig = {}

    def _wrap(self, name: str, orig):
        if name in _P2P_NAMES:
            p2p = _send_objects if name == "send_object_list" else _recv_objects
            return functools.wraps(orig)(lambda *args, **kwargs: p2p(orig, args, kwargs))

        @functools.wraps(orig)
        def call(*args, **kwargs):
            if active() is not None:  # one inside another's parts (none does so today): as it is
                return orig(*args, **kwargs)
            if name in ("broadcast_object_list", "scatter_object_list"):
                args, kwargs = _as_source(name, orig, args, kwargs)
            self._assume(name)
            _running.name = name
            try:
                return orig(*args, **kwargs)
            finally:
                _running.name = None

        return call
