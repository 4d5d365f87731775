"""The storage ledger: the live device storages of a run, and what they were at each core's peak.

One record per storage (:class:`StorageRecord`), one snapshot policy. A real run feeds it
from the op outputs it sees (a storage lives while a tensor seen on it does); a dry run
from its reservations (a storage lives until its Python storage object dies, and holds a
token of the allocator's accounting). Either way, a core's snapshot is re-taken whenever
its usage passes the last snapshot's by ``PEAK_STEP``.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import weakref

from .recording import MemoryCategory, MemorySnapshot, TopTensor

PEAK_STEP = 1.02  # re-take a core's snapshot when its usage grows by 2%
TOP_TENSORS = 10  # storages listed per snapshot


@dataclasses.dataclass(slots=True)
class StorageRecord:
    nbytes: int
    shape: tuple
    dtype: str
    op: str  # the ATen op that made it
    core: int
    collective: bool = False  # made by a collective (its buffers)
    token: int = 0  # the allocator reservation behind it (a dry run's)
    holders: int = 0  # tensors seen on it that are alive (a real run's)
    refs: list = dataclasses.field(default_factory=list)  # their weak references, kept alive here


class StorageLedger:
    """Live storages by key, per-core usage as the ledger counts it, and the snapshots.

    ``categorize`` (optional): returns {storage key: MemoryCategory} for the storages that
    parameters, gradients and optimizer state use now; snapshots then break usage down.
    """

    def __init__(self, categorize=None):
        self.live: dict = {}  # key -> StorageRecord
        self.usage: dict = collections.defaultdict(int)  # core -> bytes of its live records
        self.snapshots: dict = {}  # core -> MemorySnapshot
        self.categorize = categorize

    # -- a real run: tensors seen on a storage ------------------------------------------------
    def hold(self, key, t, op: str) -> int:
        """Note tensor `t` (on the storage `key`) as made by `op`; returns the bytes newly
        recorded (0 when the storage was known)."""
        rec = self.live.get(key)
        added = 0
        if rec is None:
            st = t.untyped_storage()
            rec = self.live[key] = StorageRecord(
                st.nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."), op, t.device.index
            )
            added = rec.nbytes
            self.usage[rec.core] += added
        rec.holders += 1
        live, usage = self.live, self.usage

        def _dead(_ref, key=key, rec=rec):
            rec.holders -= 1
            if rec.holders == 0 and live.get(key) is rec:
                del live[key]
                usage[rec.core] -= rec.nbytes

        rec.refs.append(weakref.ref(t, _dead))
        return added

    # -- a dry run: reservations --------------------------------------------------------------
    def add(self, key, rec: StorageRecord) -> None:
        self.live[key] = rec
        self.usage[rec.core] += rec.nbytes

    def pop(self, key) -> StorageRecord | None:
        rec = self.live.pop(key, None)
        if rec is not None:
            self.usage[rec.core] -= rec.nbytes
        return rec

    def resize(self, rec: StorageRecord, nbytes: int, token: int) -> None:
        self.usage[rec.core] += nbytes - rec.nbytes
        rec.nbytes, rec.token = nbytes, token

    # -- snapshots ------------------------------------------------------------------------------
    def grew(self, core: int, usage: int) -> bool:
        """Whether `usage` passed the core's snapshot by the step (or it has none)."""
        snap = self.snapshots.get(core)
        return snap is None or usage > snap.at * PEAK_STEP

    def note(self, core: int, usage: int | None = None) -> None:
        """Re-take the core's snapshot if `usage` (default: the ledger's own) grew past the last."""
        usage = self.usage[core] if usage is None else usage
        if self.grew(core, usage):
            self.snapshots[core] = self._snapshot(core, usage)

    def _snapshot(self, core: int, at: int) -> MemorySnapshot:
        live = [(k, r) for k, r in self.live.items() if r.core == core and r.nbytes]
        cat = self.categorize() if self.categorize is not None else None
        breakdown = None
        if cat is not None:
            breakdown = dict.fromkeys((c.value for c in MemoryCategory), 0)
            for k, r in live:
                breakdown[self._kind(cat, k, r)] += r.nbytes
        top = heapq.nlargest(TOP_TENSORS, live, key=lambda kr: kr[1].nbytes)
        return MemorySnapshot(
            at,
            [
                TopTensor(r.nbytes, list(r.shape), r.dtype, r.op, self._kind(cat, k, r) if cat is not None else None)
                for k, r in top
            ],
            breakdown,
        )

    @staticmethod
    def _kind(cat: dict, key, rec: StorageRecord) -> str:
        c = cat.get(key) or (MemoryCategory.COLLECTIVE_BUFFERS if rec.collective else MemoryCategory.ACTIVATIONS)
        return c.value
