"""torch.compile: Dynamo's metrics over the run, recompilations per step, and where graphs broke."""

from __future__ import annotations

import collections
import logging
import sys

import torch

from ... import _torch_private
from ..recording import CompileRecord


class _GraphBreakTap(logging.Filter):
    """Collects Dynamo's graph-break log records. A logger filter, not a handler: the records
    reach the logger's handlers (the terminal) only if the user had enabled them."""

    def __init__(self, sink: collections.Counter, user_enabled: bool):
        super().__init__()
        self.sink = sink
        self.user_enabled = user_enabled

    def filter(self, record) -> bool:
        msg = record.getMessage()
        m = _torch_private.GRAPH_BREAK_AT.search(msg)
        if m:
            self.sink[(msg[:4000], f"{m.group(1)}:{m.group(2)}")] += 1
        return self.user_enabled


def _dynamo_metrics():
    if "torch._dynamo" not in sys.modules:
        return None
    return torch.neuron.get_dynamo_metrics()


class Compile:
    """Dynamo's metrics at the start and end (deltas: its counters are process-wide), the
    recompilation count at every optimizer step, and each graph break's source line."""

    def __init__(self, spans):
        self.spans = spans
        self.breaks: collections.Counter = collections.Counter()  # (log message, site) -> count
        self._step_recompiles: list = []
        self._m0 = None
        self._tap = None
        self._level = None

    def start(self) -> None:
        self._m0 = _dynamo_metrics()
        self.spans.on_step(self._on_step)
        log = logging.getLogger(_torch_private.GRAPH_BREAK_LOGGER)
        self._level = log.level
        self._tap = _GraphBreakTap(self.breaks, log.isEnabledFor(logging.DEBUG))
        log.addFilter(self._tap)
        log.setLevel(logging.DEBUG)  # Dynamo logs graph breaks only to an enabled logger

    def stop(self) -> None:
        if self._tap is not None:
            log = logging.getLogger(_torch_private.GRAPH_BREAK_LOGGER)
            log.removeFilter(self._tap)
            log.setLevel(self._level)
            self._tap = None

    def _on_step(self) -> None:
        m = _dynamo_metrics()
        self._step_recompiles.append(m["num_recompilations"] if m else 0)

    def record(self) -> CompileRecord:
        return _compile_delta(self._m0, _dynamo_metrics(), self.breaks, self._step_recompiles)


def _located(counted: dict, breaks: collections.Counter) -> list:
    """Graph breaks by (reason, site): Dynamo's counter key is the reason proper; the log
    message holds it after a preamble."""
    located = collections.Counter()
    for (msg, site), n in breaks.items():
        reason = next((r for r in counted if r.splitlines()[0] in msg), None)
        if reason is None:
            m = _torch_private.GRAPH_BREAK_AT.search(msg)
            reason = m.group(3).strip() if m else msg.splitlines()[0]
        located[(reason, site)] += n
    return [{"reason": r, "site": s, "count": n} for (r, s), n in located.most_common()]


def _compile_delta(m0, m1, breaks: collections.Counter, step_recompiles: list) -> CompileRecord:
    """Compile metrics gathered during the recording."""
    if m1 is None:
        return CompileRecord()
    m0 = m0 or {"graphs": [], "recompilations": [], "fallbacks": [], "graph_break_reasons": {}, "num_recompilations": 0}
    per_step, prev = [], m0["num_recompilations"]
    for n in step_recompiles:
        per_step.append(n - prev)
        prev = n
    counted = {}
    for reason, n in m1["graph_break_reasons"].items():
        n -= m0["graph_break_reasons"].get(reason, 0)
        if n > 0:
            counted[reason] = n
    return CompileRecord(
        graphs=m1["graphs"][len(m0["graphs"]) :],
        recompilations=m1["recompilations"][len(m0["recompilations"]) :],
        fallbacks=m1["fallbacks"][len(m0["fallbacks"]) :],
        graph_break_counts=counted,
        graph_breaks=_located(counted, breaks),
        step_recompilations=per_step,
    )
