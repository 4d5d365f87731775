"""The dry run's memory accounting: each new neuron storage reserved on its core, as a real run allocates it.

Reservations go through the device's own allocator (``torch.neuron.memory_allocated``, peaks,
the cache of freed blocks and ``torch.OutOfMemoryError`` at the core's HBM capacity, raised by
the op that would raise it on the device), are recorded in the storage ledger, and are released
when the storage's Python object dies. Everything here runs under the run's lock (an RLock: the
mode's dispatch, the fake mode's callback, storage finalizers and resizes, from any thread).
"""

from __future__ import annotations

import weakref

import torch

from ... import _C
from .. import _torch_private as _tp
from ..record.ledger import StorageLedger, StorageRecord
from ..record.recording import MemoryCategory

_WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor.default


class Accounting:
    """Reservations of the run's neuron storages; `tensors_held()` gives the parameters (with
    their gradients) and the optimizer state the run holds now, for the memory breakdown."""

    def __init__(self, lock, tensors_held):
        self.ledger = StorageLedger(categorize=self._categories)
        self._lock = lock
        self._tensors_held = tensors_held
        self._refs: dict = {}  # storage key -> weakref to the storage
        # storage key -> (key and storage of the reservation whose memory it is, weakref to it)
        self._aliases: dict = {}
        self.fake_mode = None  # set when the run starts

    def on_fake_op(self, func, args, kwargs, out) -> None:
        """Every fake op, from the fake mode itself: ops on DTensor shards too. An op that reads
        a storage this run holds is device work, and its new outputs are reserved; one that
        reads none is metadata work on fakes a library made for it (or a factory, which
        ``after_op`` accounts)."""
        with self._lock:
            if not any(self._held(_tp.storage_key(t)[0]) for t in _tp.fake_inputs(args, kwargs)):
                return
            if func is _WAIT_TENSOR and isinstance(out, _tp.FakeTensor):
                self._same_memory(out, args[0])
            else:
                self.account_outputs(func, out)

    def after_op(self, func, out) -> None:
        """An op the dry run's mode ran fake: its outputs leave the fake mode's memo, and new
        neuron storages among them (a factory's) are reserved."""
        outs = out if isinstance(out, (list, tuple)) else (out,)
        tensors = [t for t in outs if isinstance(t, torch.Tensor)]
        if tensors:
            _tp.forget_outputs(self.fake_mode, tensors)
            self.account_outputs(func, out)

    def _same_memory(self, t, of) -> None:
        """`t` is the memory of `of`, which the run holds: a wait returns the buffer its collective
        wrote (on the device, the same tensor), where the fake mode makes a new one. No new
        reservation: `of`'s storage is kept while `t`'s lives, so the memory is released when the
        last of them dies, as the device's would be (counted twice, a caller that keeps both, as
        ring attention's all-to-all rotater does, would hold the buffer twice)."""
        key, st = _tp.storage_key(t)
        of_key, of_st = _tp.storage_key(of)
        if key in self.ledger.live or key in self._aliases:
            return
        if of_key in self._aliases:  # a wait on a wait's result
            of_key, of_st, _ = self._aliases[of_key]
        self._aliases[key] = (of_key, of_st, weakref.ref(st, lambda _r: self._aliases.pop(key, None)))

    def _held(self, key) -> bool:
        """Whether the run holds the storage `key` (its own reservation, or another's memory)."""
        return key in self.ledger.live or key in self._aliases

    def account_outputs(self, func, out) -> None:
        """Reserves each new neuron storage among an op's outputs, as the device's allocator would."""
        name = None
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if not isinstance(t, _tp.FakeTensor) or t.device.type != "neuron":
                continue
            key, st = _tp.storage_key(t)
            if self._held(key):
                continue
            if name is None:
                name = func.name()
            self._reserve(key, st, st.nbytes(), t, name)

    def _reserve(self, key, st, nbytes: int, t, op: str) -> None:
        core = t.device.index
        token = _C._reserve(core, nbytes) if nbytes else 0  # raises torch.OutOfMemoryError where the device would
        collective = op.startswith(("c10d::", "_c10d_functional::"))
        rec = StorageRecord(nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), op, core, collective, token)
        self.ledger.add(key, rec)
        self._refs[key] = weakref.ref(st, lambda _r, key=key: self._release(key))
        self.ledger.note(core)

    def _release(self, key) -> None:
        with self._lock:
            self._refs.pop(key, None)
            rec = self.ledger.pop(key)
            if rec is not None and rec.token:
                _C._release(rec.token)

    def on_resize(self, storage, nbytes: int) -> None:
        """FSDP2's storage resizes: the storage's memory is released or re-reserved."""
        with self._lock:
            # Only neuron storages have records; a fake tensor's storage itself is on "meta".
            rec = self.ledger.live.get(_tp.storage_key_of(storage))
            if rec is None or rec.nbytes == nbytes:
                return
            token = _C._reserve(rec.core, nbytes) if nbytes else 0  # may raise OutOfMemoryError, as FSDP2's would
            if rec.token:
                _C._release(rec.token)
            self.ledger.resize(rec, nbytes, token)
            self.ledger.note(rec.core)

    def _categories(self) -> dict:
        """storage key -> MemoryCategory, for the storages parameters, gradients and optimizer state use now."""
        cat = {}

        def mark(t, c):
            if isinstance(t, torch.Tensor):
                t = _tp.local(t)
                if t.device.type == "neuron":
                    key = _tp.storage_key(t)[0]
                    cat.setdefault(self._aliases[key][0] if key in self._aliases else key, c)

        params, state = self._tensors_held()
        for v in state:
            mark(v, MemoryCategory.OPTIMIZER_STATE)
        for p in params:
            mark(p, MemoryCategory.PARAMETERS)
            mark(p.grad, MemoryCategory.GRADIENTS)
        return cat
