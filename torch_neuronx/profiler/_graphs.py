"""Device spans of compiled graphs.

The code Inductor generates for neuron runs a graph's kernels inside
``with torch.neuron.device(i), torch.neuron._compiled_graph(i):``; while a
profiler traces the device, that scope becomes one device event named after
the graph; while a listener is set (a readiness recording sets one), it tells the
listener which graph runs, so the recording can cost the graph whole. Otherwise
entering it costs two checks. Graphs run by other means (a dry run's graphs, run op
by op) are registered and announced through the same calls (``register_graph``,
``graph_run``), so a listener sees every compiled graph one way.
"""

import os
import sys
import threading

from .. import _C

_lock = threading.Lock()
_names: dict = {}  # file of a generated graph module -> "<graph> forward|backward"
_gms: dict = {}  # file of a generated graph module -> the ATen FX graph it was compiled from
# An object with graph_enter(key) / graph_exit(), told of every compiled graph run; the key
# is the generated module's file, or the key a graph was registered under.
_listener = None


def set_listener(listener):
    """Tell `listener` (or nobody, for None) of every compiled graph run; returns the previous one."""
    global _listener
    prev, _listener = _listener, listener
    return prev


def register_graph(key: str, name: str, gm) -> None:
    """Name a graph run by other means than generated code, under `key`, with its ATen graph."""
    if _listener is not None:
        with _lock:
            _names[key] = name
            _gms[key] = gm


def graph_name(key: str) -> str:
    return _names.get(key, key)


def aten_graph(key: str):
    """The ATen FX graph kept for the graph of `key`, or None."""
    return _gms.get(key)


class graph_run:
    """A run of the graph registered under `key`, announced to the listener."""

    __slots__ = ("_key", "_listener")

    def __init__(self, key: str):
        self._key = key
        self._listener = None

    def __enter__(self):
        listener = _listener
        if listener is not None:
            self._listener = listener
            listener.graph_enter(self._key)
        return self

    def __exit__(self, *exc):
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.graph_exit()
        return False


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


def listening() -> bool:
    """Whether a listener wants the ATen graph of graphs compiled now."""
    return _listener is not None


class _compiled_graph:
    __slots__ = ("_device", "_span", "_run")

    def __init__(self, device: int):
        self._device = device
        self._span = None
        self._run = None

    def __enter__(self):
        if _listener is not None:  # the generated module's file is the graph's key
            self._run = graph_run(sys._getframe(1).f_code.co_filename)
            self._run.__enter__()
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
        if self._run is not None:
            run, self._run = self._run, None
            run.__exit__(*exc)
        return False
