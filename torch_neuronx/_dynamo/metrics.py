"""Compile metrics of backend "neuron": ``torch.neuron.get_dynamo_metrics()``.

Counts are per process since the last ``reset_dynamo_metrics()``. Graph breaks
come from Dynamo's own counters, so they cover every graph Dynamo split.
"""

from __future__ import annotations

import copy
import threading

_lock = threading.Lock()


def _empty() -> dict:
    return {
        "graphs_compiled": 0,  # graphs compiled by backend "neuron" (each shape counts)
        "cache_hits": 0,  # graphs loaded from the persistent cache
        "cache_misses": 0,  # graphs compiled from scratch (then stored)
        "compile_seconds": 0.0,  # wall time spent compiling
        "recompilations": [],  # {"graph", "shapes", "reason", "compiled"}; compiled False: no graph reached the backend
        "dynamo_recompiles": 0,  # frames Dynamo recompiled (its recompile hook), limit hits included
        "fallbacks": [],  # {"graph", "error"}: graphs run eagerly
        "graphs": [],  # {"graph", "shapes", "seconds", "cache"}
        "cache_discarded": [],  # corrupted cache entries deleted before use
    }


_state = _empty()
_graph_break_base: dict = {}


def _graph_break_counter() -> dict:
    import sys

    if "torch._dynamo.utils" not in sys.modules:  # nothing compiled yet
        return {}
    from ._inductor_glue import dynamo_counters

    return dict(dynamo_counters().get("graph_break", {}))


class DynamoMetrics(dict):
    """A dict of compile metrics; ``print()`` it for a readable report."""

    def __str__(self) -> str:
        return format_report(self)


def get_dynamo_metrics() -> DynamoMetrics:
    """Compile metrics of backend "neuron" since the last reset."""
    with _lock:
        out = copy.deepcopy(_state)
    breaks = {}
    for reason, n in _graph_break_counter().items():
        n -= _graph_break_base.get(reason, 0)
        if n > 0:
            breaks[reason] = n
    out["graph_breaks"] = sum(breaks.values())
    out["graph_break_reasons"] = breaks
    for r in out["recompilations"]:
        r.pop("_compile_id", None)
    out["num_recompilations"] = len(out["recompilations"])
    return DynamoMetrics(out)


def reset_dynamo_metrics() -> None:
    """Zero all counters (graph breaks are counted from now on)."""
    global _state, _graph_break_base
    with _lock:
        _state = _empty()
        _fallback_causes.clear()
        _graph_break_base = _graph_break_counter()


def record_graph(graph: str, shapes, seconds: float, cache: str, site: str | None = None) -> None:
    """One compiled graph; cache is "hit", "miss" or "disabled"; site: where its code begins."""
    with _lock:
        _state["graphs_compiled"] += 1
        _state["compile_seconds"] += seconds
        if cache == "hit":
            _state["cache_hits"] += 1
        elif cache == "miss":
            _state["cache_misses"] += 1
        entry = {"graph": graph, "shapes": shapes, "seconds": round(seconds, 4), "cache": cache}
        _state["graphs"].append(entry if site is None else {**entry, "site": site})


def add_compile_seconds(seconds: float) -> None:
    """Time spent compiling outside a graph's first call (lazy backward graphs)."""
    with _lock:
        _state["compile_seconds"] += seconds


def record_dynamo_recompile(frame_id: int, attempt: int, reason: str) -> None:
    """Dynamo recompiles a frame (its own decision; the backend may never see it)."""
    with _lock:
        _state["dynamo_recompiles"] += 1
        # A placeholder until the backend compiles the graph: one Dynamo stops at its
        # recompile limit (or a frame without a graph) stays compiled=False.
        _state["recompilations"].append(
            {
                "graph": f"frame_{frame_id}",
                "shapes": None,
                "reason": reason,
                "compiled": False,
                "_compile_id": (frame_id, attempt),
            }
        )


def record_recompilation(graph: str, shapes, reason: str, compile_id=None) -> None:
    """A recompiled graph reached the backend (`compile_id` set: Dynamo's recompile of that id)."""
    with _lock:
        if compile_id is not None:
            for r in reversed(_state["recompilations"]):
                if r.get("_compile_id") == compile_id:
                    if not r["compiled"]:  # the first graph of the recompiled frame
                        r.update(graph=graph, shapes=shapes, compiled=True)
                    return  # further graphs of a recompiled frame are the same recompile
        _state["recompilations"].append({"graph": graph, "shapes": shapes, "reason": reason, "compiled": True})


def record_fallback(graph: str, error: str) -> None:
    with _lock:
        _state["fallbacks"].append({"graph": graph, "error": error})


_fallback_causes: set = set()


def new_fallback_cause(cause: str) -> bool:
    """True the first time `cause` made a graph fall back since the last reset."""
    with _lock:
        if cause in _fallback_causes:
            return False
        _fallback_causes.add(cause)
        return True


def record_discarded(entries) -> None:
    with _lock:
        _state["cache_discarded"].extend(entries)


def format_report(m: dict) -> str:
    lines = [
        "torch.compile backend 'neuron' -- compile metrics",
        f"  graphs compiled      {m['graphs_compiled']}",
        f"  cache hits / misses  {m['cache_hits']} / {m['cache_misses']}",
        f"  compile time         {m['compile_seconds']:.2f} s",
        f"  recompilations       {len(m['recompilations'])}",
    ]
    if m["graphs"]:
        shown = ", ".join(f"{g['graph']} ({g['cache']})" for g in m["graphs"][:6])
        lines.insert(2, f"    - {shown}{' ...' if len(m['graphs']) > 6 else ''}")
    for r in m["recompilations"]:
        if not r["compiled"]:
            lines.append(
                f"    - {r['graph']} not compiled (Dynamo's recompile limit, or no graph): {r['reason'].splitlines()[0][:160]}"
            )
            continue
        shapes = str(r["shapes"])
        shapes = shapes if len(shapes) <= 160 else shapes[:157] + "..."
        lines.append(f"    - {r['graph']}: {r['reason'].splitlines()[0][:160]}; shapes {shapes}")
    lines.append(f"  graph breaks         {m.get('graph_breaks', 0)}")
    for reason, n in m.get("graph_break_reasons", {}).items():
        lines.append(f"    - {n}x {reason.splitlines()[0][:160]}")
    if m.get("cache_discarded"):
        lines.append(f"  corrupted cache entries discarded  {len(m['cache_discarded'])}")
    if m["fallbacks"]:
        lines.append(f"  eager fallbacks      {len(m['fallbacks'])}")
        for f in m["fallbacks"]:
            lines.append(f"    - {f['graph']}: {f['error'].splitlines()[0][:160]}")
    return "\n".join(lines)
