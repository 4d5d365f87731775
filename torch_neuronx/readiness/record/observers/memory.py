"""Memory: the allocator's counters per core (peaks, a time series, OOMs) and the ledger's snapshots."""

from __future__ import annotations

import collections
import time

import torch

from .... import _C
from ....neuron import memory as _memory
from ... import _torch_private
from ..ledger import PEAK_STEP
from ..recording import CoreMemory, MemorySnapshot

_SAMPLE_S = 0.002  # memory counters are read at most this often per core
_SERIES_MAX = 20000


def counters(core: int) -> dict:
    """The core's allocator counters, read from torch.neuron's memory stats (their one source; a
    sample reads the two it needs through the same module's cheaper `_in_use`, and the recording's
    peaks are the core's high-water marks, `_high_water`)."""
    s = _memory._device_stats(core)
    return {
        "allocated_current": s["allocated_bytes"]["all"]["current"],
        "reserved_current": s["reserved_bytes"]["all"]["current"],
        "num_ooms": s["num_ooms"],
        "capacity": torch.neuron.mem_get_info(core)[1],
    }


class Memory:
    """Samples each core's counters as ops run on it (at most every 2 ms, and whenever usage may
    have passed the last snapshot by the ledger's step). With `track_outputs` (a real run) it
    also feeds the ledger with every op's neuron outputs, and snapshots it at sampled usage; a
    dry run's executor feeds and snapshots the ledger itself."""

    def __init__(self, ledger, track_outputs: bool):
        self.ledger = ledger
        self.track_outputs = track_outputs
        self._series: dict = collections.defaultdict(list)  # core -> [(t, allocated, reserved)]
        self._next_sample: dict = collections.defaultdict(float)
        self._snap_at: dict = {}  # core -> allocated at the last sample that passed the step
        # core -> allocated at the last counter read + bytes of storages first seen since: an
        # upper bound on usage now, so a new peak is never missed between timed samples
        self._bound: dict = collections.defaultdict(int)
        self._ooms0: dict = {}
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.track_outputs:
            self._adopt_existing_tensors()
        if _C._is_initialized():
            # the recording's peaks are this run's: like a profiler, start them afresh. It reads
            # the cores' high-water marks, which the script's own resets of its peaks (torchtitan
            # resets them after each logged step) leave alone. OOMs before it are not this run's
            # (the counter is process-wide)
            for i in range(torch.neuron.device_count()):
                torch.neuron.reset_peak_memory_stats(i)
                _memory._reset_high_water(i)
                self._ooms0[i] = counters(i)["num_ooms"]

    def stop(self) -> None:
        self.sample_all()

    def after_op(self, core: int, outs: list, name: str) -> None:
        if self.track_outputs:  # views too: a view keeps its storage alive
            for t in outs:
                if t.device.type == "neuron":
                    self._track(t, name)
        at = self._snap_at.get(core)
        if time.perf_counter() >= self._next_sample[core] or (at is not None and self._bound[core] > at * PEAK_STEP):
            self.sample(core)

    def _track(self, t, op: str) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr:
            self._bound[t.device.index] += self.ledger.hold(ptr, t, op)

    def _adopt_existing_tensors(self) -> None:
        """Tensors allocated before the recording started (e.g. a model built earlier)."""
        if not _C._is_initialized():
            return
        if not any(torch.neuron.memory_allocated(i) for i in range(torch.neuron.device_count())):
            return
        import gc

        for obj in gc.get_objects():
            if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.device.type != "neuron":
                continue
            if not _torch_private.is_functorch_wrapper(obj):  # one a vmap leaked has no storage
                self._track(obj, "(before the report started)")

    def sample_all(self) -> None:
        for core in list(self._series):
            self.sample(core, force=True)

    def sample(self, core: int, force: bool = False) -> None:
        now = time.perf_counter()
        self._next_sample[core] = now + _SAMPLE_S
        alloc, reserved = _memory._in_use(core)  # the two counters a sample needs, cheaply
        self._bound[core] = alloc
        series = self._series[core]
        if len(series) < _SERIES_MAX or force:
            series.append((round(now - self._t0, 6), alloc, reserved))
        at = self._snap_at.get(core)
        if at is None or alloc > at * PEAK_STEP:
            self._snap_at[core] = alloc
            if self.track_outputs:
                self.ledger.note(core, alloc)

    def record(self) -> dict:
        """core -> CoreMemory, for every core an op ran on."""
        out = {}
        for core in sorted(self._series):
            c = counters(core)
            out[core] = CoreMemory(
                *_memory._high_water(core),
                c["capacity"],
                c["num_ooms"] - self._ooms0.get(core, 0),
                self._series[core],
                self.ledger.snapshots.get(core) or MemorySnapshot(self._snap_at.get(core, 0)),
            )
        return out
