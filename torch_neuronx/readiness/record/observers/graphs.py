"""Compiled graphs: each run counted whole, with the cost of its ATen graph."""

from __future__ import annotations

import threading

from ....profiler import _graphs
from ..measure import cached_parts, is_dynamic


class Graphs:
    """Told of every compiled graph run (the profiler layer's graph listener): counts the
    run in the open buckets, costed once per graph from the ATen graph it was compiled from,
    and not the ATen ops its code calls (a graph without a kept ATen graph, e.g. one loaded
    whole from AOTAutograd's cache, is counted op by op instead)."""

    def __init__(self, spans, phases, errors):
        self.spans, self.phases, self.errors = spans, phases, errors
        self.parts: dict = {}  # graph name -> [GraphPart] of one run
        self._names: dict = {}  # graph key -> graph name (None: not costed)
        self._tls = threading.local()  # .in_graph: this thread runs a costed compiled graph
        self._prev = None

    def start(self) -> None:
        self._prev = _graphs.set_listener(self)

    def stop(self) -> None:
        _graphs.set_listener(self._prev)

    def in_graph(self) -> bool:
        return getattr(self._tls, "in_graph", False)

    def graph_enter(self, key: str) -> None:
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        tls.depth = depth + 1
        if depth:
            return
        try:
            if key not in self._names:
                self._names[key] = self._cost(key)
            name = self._names[key]
        except Exception as e:  # never break the user's run; say so in the report
            self.errors[f"costing compiled graph {key}: {type(e).__name__}: {e}"] += 1
            name = self._names[key] = None
        tls.in_graph = name is not None
        if name is not None:
            self.spans.count_graph(name)
            self.phases.graph_ran()

    def graph_exit(self) -> None:
        tls = self._tls
        tls.depth -= 1
        if not tls.depth:
            tls.in_graph = False

    def _cost(self, key: str):
        gm = _graphs.aten_graph(key)
        if gm is None or is_dynamic(gm):
            return None
        name = f"compiled graph {_graphs.graph_name(key)}"
        while name in self.parts:  # two graphs under one name (e.g. recompiled): keep both
            name += "'"
        self.parts[name] = cached_parts(gm)
        return name
