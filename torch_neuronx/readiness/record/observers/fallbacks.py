"""CPU fallbacks: the ops that run (or, in a dry run, would run) on the host CPU on Trainium."""

from __future__ import annotations

import collections

from .... import _C
from ...._sites import user_site
from ..measure import MEMORY_KERNEL_OPS, dtype_name
from ..recording import Fallback


class RealFallbacks:
    """A real run: the device counts the ops it ran on the CPU; read that count around each op."""

    @staticmethod
    def before() -> int:
        return _C._fallback_count()

    @staticmethod
    def after(token: int):
        """The reason the op just run fell back (or a kernel inside it, e.g. the fill_ that
        aten::ones runs), or None."""
        return _C._last_fallback_reason() if _C._fallback_count() != token else None

    @staticmethod
    def reason(func, ins, outs, early):
        return early


class WouldBeFallbacks:
    """A dry run: nothing runs, so nothing falls back; ask the device what a real run would do,
    only for ops that count (once per op and dtypes)."""

    def __init__(self):
        self._cache: dict = {}  # (op, dtypes) -> reason ("" for none)

    @staticmethod
    def before():
        return None

    @staticmethod
    def after(token):
        return None

    def reason(self, func, ins, outs, early):
        dtypes = tuple(sorted({t.dtype for t in ins + outs if t.device.type == "neuron"}, key=str))
        if not dtypes or func.name().split(".")[0] in MEMORY_KERNEL_OPS:
            return None
        key = (func, dtypes)
        reason = self._cache.get(key)
        if reason is None:
            reason = self._cache[key] = _C._fallback_reason(func.name(), list(dtypes))
        return reason or None


class Fallbacks:
    """Fallbacks by (op, dtype, reason), with the sites that issued them."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._seen: dict = {}  # (op, dtype, reason) -> Counter(site)

    def check(self, func, name: str, ins: list, outs: list, early) -> None:
        reason = self.strategy.reason(func, ins, outs, early)
        if reason is None:
            return
        # "<dtype> is not native" names the dtype; "no Trainium lowering" has none.
        dtypes = {dtype_name(t.dtype) for t in ins} | {dtype_name(t.dtype) for t in outs}
        d = reason.split(" ", 1)[0]
        key = (name, d if d in dtypes else "-", reason)
        self._seen.setdefault(key, collections.Counter())[user_site()] += 1

    def record(self) -> list:
        return [
            Fallback(op, dtype, reason, sum(s.values()), dict(s.most_common()))
            for (op, dtype, reason), s in self._seen.items()
        ]
