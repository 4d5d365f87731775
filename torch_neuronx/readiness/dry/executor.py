"""The dry executor: a script at its real size, on the simulator, with no data.

Every neuron tensor, and every host tensor over 16 MiB (a model built on CPU before it moves), is
a fake one: exact shapes, dtypes, strides and devices, no memory behind it, and every op on it
runs its shape computation only (PyTorch's ``FakeTensorMode``). Small host work on real inputs
runs for real and keeps its values. The device's allocator accounting stays real
(``accounting``). What it cannot know, values, the value store answers (``values``, ``reads``).

This class only assembles the parts: the fake mode (``_torch_private.new_fake_mode``), the dry
run's mode above it (``mode``), the taps (``taps``), the parameter registry (``parameters``), and
the lower layers' hooks: process groups are PyTorch's fake one
(``distributed.backend.set_backend_override``) and compiled graphs are partitioned without code
generation (``_dynamo.backend.compile_without_codegen``). Modes, innermost first: the fake mode,
the dry run's, and the recorder's above both.
"""

from __future__ import annotations

import threading

from ..._dynamo import backend as _compile_backend
from ...distributed import backend as _c10d_backend
from .. import _torch_private as _tp
from ..record.observers.fallbacks import WouldBeFallbacks
from . import checkpoints, objects
from .accounting import Accounting
from .checkpoints.saving import Unwritten
from .mode import REAL_HOST_BYTES, DryMode
from .parameters import Parameters
from .taps import dry_run_taps
from .values import ValueStore

_active = None  # the DryExecutor running in this process


class DryExecutor:
    """Runs the code between ``start()`` and ``stop()`` with fake tensors and real accounting."""

    dry = True
    ignores_fake_tensors = False  # every tensor is a fake one: they are the run

    def __init__(self):
        # Threads the script starts run ops here too (and storages die in any thread).
        self.lock = threading.RLock()
        self.parameters = Parameters()
        self.accounting = Accounting(self.lock, self.parameters.held)
        self.ledger = self.accounting.ledger
        self.fallbacks = WouldBeFallbacks()
        self.values = ValueStore()
        self.saved: list = []  # the files saved without data, as the report lists them
        self.unwritten = Unwritten()  # those of them torch.save did not write
        self._taps = dry_run_taps(self.accounting, self.values, self.saved, self.unwritten)
        self.fake_mode = None
        self.mode = None
        self._thread_tap = None

    def start(self) -> None:
        global _active
        if _active is not None:
            raise RuntimeError("a dry run is already in progress in this process")
        self.fake_mode = self.accounting.fake_mode = _tp.new_fake_mode(self.accounting.on_fake_op, REAL_HOST_BYTES)
        self.fake_mode.__enter__()
        self.mode = DryMode(self)
        self.mode.__enter__()
        self._thread_tap = _tp.ThreadTap([self.fake_mode, self.mode])
        for tap in self._taps + [self._thread_tap]:
            tap.install()
        self.parameters.start()
        _c10d_backend.set_backend_override(_tp.fake_process_group)
        _compile_backend.compile_without_codegen("dry run")
        _active = self

    def stop(self) -> None:
        global _active
        _compile_backend.compile_without_codegen(None)
        _c10d_backend.set_backend_override(None)
        self.parameters.stop()
        for tap in self._taps + ([self._thread_tap] if self._thread_tap else []):
            tap.remove()
        self._thread_tap = None
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.fake_mode.__exit__(None, None, None)
            self.mode = None
        _active = None

    def failed(self, exc: BaseException) -> None:
        """transformers' error for a directory without weights gets the dry run's way out as a note,
        and a missing file that torch.save did not write says so."""
        checkpoints.note_missing_weights(exc)
        self.unwritten.note(exc)

    def contribute(self, recording) -> None:
        recording.dry_run = True
        recording.value_reads = self.values.record()
        recording.saved_without_data = list(self.saved)

    @staticmethod
    def object_collective() -> str | None:
        """The object collective whose parts this thread issues now (they carry this rank's objects)."""
        return objects.active()
