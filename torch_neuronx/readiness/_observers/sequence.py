"""Each process group's sequence of collectives, as this rank issued them: what ranks compare.

Every c10d collective is logged, on any device (object collectives and barriers run on host
tensors, in the same ordered stream of the group as the device's): its number in the group,
op, input shapes, dtype, reduce op, peer (send and recv), and the source line that issued it.
"""

from __future__ import annotations

from ..._sites import user_site
from ...distributed import backend as _c10d_backend
from .. import _objects, _torch_private
from .._cost import dtype_name, tensors
from .._record import CollectiveEntry, GroupLog

_MAX_ENTRIES = 100_000  # per group: enough for any comparison, bounded for a long run
_P2P = {"send": 2, "recv": 2, "recv_any_source": None, "isend": None, "irecv": None}  # op -> peer argument


def _reduce_op(args) -> str | None:
    for a in args:
        if isinstance(a, str) and a.lower() in _REDUCE_NAMES:  # functional collectives name it
            return a.lower()
        name = _torch_private.reduce_op_name(a)
        if name is not None:
            return name
    return None


_REDUCE_NAMES = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"})


class CollectiveSequence:
    """Per process group (by name): its members and the collectives this rank issued in it."""

    def __init__(self):
        self.groups: dict = {}  # group name -> GroupLog

    def start(self) -> None:
        _c10d_backend.add_group_listener(self._joined)

    def stop(self) -> None:
        _c10d_backend.remove_group_listener(self._joined)

    def _joined(self, name: str, ranks: list) -> None:
        """A group this rank joins: its members as this rank made it, before any collective."""
        self.groups.setdefault(name, GroupLog(name, "", ranks))

    def record(self, func, args, kwargs, op: str) -> None:
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
        whole = _objects.active()
        if whole is not None:  # a part of an object collective: its bytes are this rank's objects'
            op = f"{op} ({whole})"
        peer = None
        if op in _P2P and _P2P[op] is not None and len(args) > _P2P[op] and isinstance(args[_P2P[op]], int):
            local = args[_P2P[op]]
            peer = log.ranks[local] if 0 <= local < len(log.ranks) else local
        log.entries.append(
            CollectiveEntry(
                len(log.entries) + 1,
                op,
                [list(t.shape) for t in ins],
                dtype_name(ins[0].dtype) if ins else "-",
                _reduce_op(args),
                peer,
                user_site(),
            )
        )

    def record_groups(self) -> dict:
        return dict(self.groups)
