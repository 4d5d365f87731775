"""Device spans of compiled graphs.

The code Inductor generates for neuron runs a graph's kernels inside
``with torch.neuron.device(i), torch.neuron._compiled_graph(i):``; while a
profiler traces the device, that scope becomes one device event named after
the graph. Otherwise entering it costs one flag check.
"""

import os
import sys
import threading

from .. import _C

_lock = threading.Lock()
_names: dict = {}  # file of a generated graph module -> "<graph> forward|backward"


def _register(compiled, name: str) -> None:
    """Name the device events of an Inductor-compiled graph (``compiled``: its output code)."""
    fn = getattr(compiled, "current_callable", None)
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    with _lock:
        _names[code.co_filename] = name


class _compiled_graph:
    __slots__ = ("_device", "_span")

    def __init__(self, device: int):
        self._device = device
        self._span = None

    def __enter__(self):
        if _C._device_tracing():
            filename = sys._getframe(1).f_code.co_filename
            name = _names.get(filename) or f"graph {os.path.splitext(os.path.basename(filename))[0]}"
            self._span = _C._GraphSpan(self._device, f"neuron graph {name}")
            self._span.__enter__()
        return self

    def __exit__(self, *exc):
        if self._span is not None:
            span, self._span = self._span, None
            span.__exit__(*exc)
        return False
