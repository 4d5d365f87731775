"""Object collectives in a dry run: ``all_gather_object``, ``gather_object``,
``broadcast_object_list`` and ``scatter_object_list`` under the dry run's value rule.

c10d pickles each object into a byte tensor and exchanges the bytes in two collectives (the
sizes, then the data). In a dry run every rank's object is taken to be this rank's, as every
rank's tensor is (``_known``): an all-gather or gather gives this rank's object from every rank,
a broadcast leaves this rank's list as it is and a scatter gives this rank its own share. A rank
other than the source pickles nothing in a real broadcast or scatter, so here it issues them as
their source, with its own objects: the same collectives, in the same order, as in a real run.
Their byte counts follow this rank's objects, so ranks compare them by op and order only
(``active()`` names the object collective running). Each call is listed in the report among the
assumed collectives, once, at the script's line.
"""

from __future__ import annotations

import functools
import threading

from .._sites import user_site
from ._values import ValueUnknownError

_NAMES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list")
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


class ObjectCollectivesTap:
    """Replaces the four object collectives in ``torch.distributed`` for the dry run only."""

    def __init__(self, assumed):
        self._assumed = assumed  # KnownValues.assumed: (site, collective) -> calls
        self._orig: dict = {}

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_available():
            return
        for name in _NAMES:
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
        @functools.wraps(orig)
        def call(*args, **kwargs):
            if active() is not None:  # one inside another's parts (none does so today): as it is
                return orig(*args, **kwargs)
            if name in ("broadcast_object_list", "scatter_object_list"):
                args, kwargs = _as_source(name, orig, args, kwargs)
            self._assumed[(user_site(), name)] += 1
            _running.name = name
            try:
                return orig(*args, **kwargs)
            finally:
                _running.name = None

        return call
