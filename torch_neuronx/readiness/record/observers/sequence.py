"""Each process group's sequence of collectives, as this rank issued them: what ranks compare.

Every c10d collective is logged, on any device (object collectives and barriers run on host
tensors, in the same ordered stream of the group as the device's): its number in the group,
op, tensor shapes, dtype, reduce op, peer (send and recv), the sizes of its agreed argument
(what the matching rule of ``neuronsim.collectives`` compares), and the source line that issued it.
"""

from __future__ import annotations

from neuronsim import collectives as _collectives

from ...._sites import user_site
from ....distributed import backend as _c10d_backend
from ... import _torch_private
from ..measure import dtype_name, tensors
from ..recording import CollectiveEntry, GroupLog

_MAX_ENTRIES = 100_000  # per group: enough for any comparison, bounded for a long run


def _reduce_op(args) -> str | None:
    for a in args:
        if isinstance(a, str) and a.lower() in _collectives.REDUCE_OPS:  # functional collectives name it
            return a.lower()
        name = _torch_private.reduce_op_name(a)
        if name is not None:
            return name
    return None


def _agreed(op: str, args) -> tuple:
    """(element count, dtype) of each tensor of the call's agreed argument."""
    i = _collectives.agreed_argument(op)
    if i is None or i >= len(args):
        return ()
    return tuple((t.numel(), dtype_name(t.dtype)) for t in tensors([args[i]], []))


class CollectiveSequence:
    """Per process group (by name): its members and the collectives this rank issued in it.
    `object_collective()` names the object collective (``all_gather_object``, ...) whose parts
    this thread issues now, in a dry run (its bytes are this rank's objects'), else None."""

    def __init__(self, object_collective):
        self.groups: dict = {}  # group name -> GroupLog
        self._object_collective = object_collective
        self._undescribed: set = set()  # groups joined whose description c10d had not set yet

    def start(self) -> None:
        _c10d_backend.add_group_listener(self._joined)

    def stop(self) -> None:
        _c10d_backend.remove_group_listener(self._joined)

    def _joined(self, name: str, ranks: list) -> None:
        """A group this rank joins: its members as this rank made it, before any collective (c10d
        describes it, a DeviceMesh dimension's name, once its backend exists: at the next collective)."""
        self.groups.setdefault(name, GroupLog(name, "", ranks))
        self._undescribed.add(name)

    def _describe(self) -> None:
        for name in list(self._undescribed):
            log = self.groups[name]
            log.desc = log.desc or _torch_private.group_desc(name)
            self._undescribed.discard(name)

    def record(self, func, args, kwargs, op: str) -> None:
        if self._undescribed:
            self._describe()
        pg = _torch_private.collective_group(func, args)
        if pg is None:
            return
        log = self.groups.get(pg.group_name)
        if log is None:
            log = self.groups[pg.group_name] = GroupLog(pg.group_name, pg.group_desc, _torch_private.group_ranks(pg))
        log.desc = log.desc or pg.group_desc
        if len(log.entries) >= _MAX_ENTRIES:
            log.truncated = True
            return
        ins = tensors(kwargs.values(), tensors(args, []))
        whole = self._object_collective()
        agreed = _agreed(op, args) if whole is None else ()  # an object's bytes are this rank's own
        if whole is not None:
            op = f"{op} ({whole})"
        peer = None
        i = _collectives.peer_argument(op)
        if i is not None and len(args) > i and isinstance(args[i], int):
            local = args[i]
            peer = log.ranks[local] if 0 <= local < len(log.ranks) else local
        entry = CollectiveEntry(
            len(log.entries) + 1,
            op,
            [list(t.shape) for t in ins],
            dtype_name(ins[0].dtype) if ins else "-",
            _reduce_op(args),
            peer,
            user_site(),
            agreed,
        )
        log.entries.append(entry)

    def describe_groups(self) -> dict:
        """The groups joined so far, each with c10d's description where it has one by now."""
        self._describe()
        return dict(self.groups)

    def record_groups(self) -> dict:
        return dict(self.groups)
