"""One recorded run: the rank context, the executor and the recorder, started and stopped in one order.

Used alike by ``readiness()`` in process and by the launcher ``torch-neuronx check`` runs in
each rank. The order, and why:

start: the executor (a dry run's modes sit below the recorder's, so the recorder sees ops
as the script issues them); the rank context (a dry run as rank R of N: its store and
environment, before any process group is made); the recorder.

stop: the recorder (nothing after this is the run's); the executor (the script's tensors
stay fake, but new work is real again); the error the run ended with (the executor adds its
notes first); the recording, while the rank's environment is still the run's; the rank
context (destroys the run's process group).
"""

from __future__ import annotations

import contextlib

from .recorder import Recorder
from .recording import Recording

_current: list = []  # the sessions recording in this process, innermost last


def current():
    """The innermost session recording now, or None."""
    return _current[-1] if _current else None


class Session:
    """``start()``, then ``stop(exc)`` -> the :class:`Recording`."""

    def __init__(self, executor, as_rank=None):
        self.executor = executor  # a RealExecutor, or the dry wing's DryExecutor
        self.as_rank = as_rank
        self.recorder = None
        self.recording: Recording | None = None

    def start(self) -> None:
        self.executor.start()
        try:
            if self.as_rank is not None:
                self.as_rank.__enter__()
            self.recorder = Recorder(self.executor)
            self.recorder.start()
        except BaseException:
            self.executor.stop()
            raise
        _current.append(self)

    def stop(self, exc: BaseException | None = None) -> Recording:
        if self in _current:
            _current.remove(self)
        try:
            self.recorder.stop()
        finally:
            self.executor.stop()
        if exc is not None:
            self.recorder.failed(exc)
        try:
            self.recording = self.recorder.recording()
        finally:
            if self.as_rank is not None:
                self.as_rank.__exit__(None, None, None)
        return self.recording


@contextlib.contextmanager
def region(name: str):
    """Count what runs inside the block apart, as the region `name` of the recording (its ops,
    collectives and compiled graphs, in every thread), besides the step it belongs to. Outside a
    recording, it does nothing; regions may nest and repeat (each entry is its own region)."""
    s = current()
    if s is None:
        yield
        return
    bucket = s.recorder.spans.open_region(str(name))
    try:
        yield
    finally:
        s.recorder.spans.close(bucket)
