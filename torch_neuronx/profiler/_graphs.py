"""Device spans of compiled graphs.

The code Inductor generates for neuron runs a graph's kernels inside
``with torch.neuron.device(i), torch.neuron._compiled_graph(i):``; while a
profiler traces the device, that scope becomes one device event named after
the graph; while a readiness report records, it tells the report which graph
runs (``_listener``), so the report can cost the graph whole. Otherwise
entering it costs two checks.
"""

import os
import sys
import threading

from .. import _C

_lock = threading.Lock()
_names: dict = {}  # file of a generated graph module -> "<graph> forward|backward"
_gms: dict = {}  # file of a generated graph module -> the ATen FX graph it was compiled from
# An object with _graph_enter(filename) / _graph_exit(), told of every compiled graph run
# (torch_neuronx.readiness sets it while it records; this module cannot import readiness).
_listener = None


def _register(compiled, name: str, gm=None) -> None:
    """Name the device events of an Inductor-compiled graph (``compiled``: its output code)
    and keep the ATen graph ``gm`` it was compiled from (with its fake-tensor metadata)."""
    fn = getattr(compiled, "current_callable", None)
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    with _lock:
        _names[code.co_filename] = name
        if gm is not None:
            _gms[code.co_filename] = gm


def _recording() -> bool:
    """Whether a listener wants the ATen graph of graphs compiled now."""
    return _listener is not None


class _compiled_graph:
    __slots__ = ("_device", "_span", "_listener")

    def __init__(self, device: int):
        self._device = device
        self._span = None
        self._listener = None

    def __enter__(self):
        listener = _listener
        if listener is not None:
            self._listener = listener
            listener._graph_enter(sys._getframe(1).f_code.co_filename)
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
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener._graph_exit()
        return False
