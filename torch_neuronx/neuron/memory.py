"""Device memory statistics of torch.neuron (per logical NeuronCore)."""
import collections
import pickle
import sys

from .. import _C
from .device import _checked

# Tensors hold "allocated" bytes (as requested); the core's caching allocator
# holds "reserved" bytes: live blocks rounded to their size class plus freed
# blocks (up to 64 MiB each) kept for reuse, which empty_cache() returns.
_ALLOCATED = ("allocated_current", "allocated_peak", "allocated_total", "freed_total")
_RESERVED = ("reserved_current", "reserved_peak", "reserved_total", "released_total")
_BYTE_STATS = {"allocated_bytes": _ALLOCATED, "active_bytes": _ALLOCATED, "requested_bytes": _ALLOCATED,
               "reserved_bytes": _RESERVED}


def memory_stats(device=None) -> dict:
    """Allocator statistics, CUDA-style flattened keys (e.g. ``allocated_bytes.all.current``)."""
    c = _C._memory_counters(_checked(device))
    stats = collections.OrderedDict()
    for key, fields in _BYTE_STATS.items():
        for name, field in zip(("current", "peak", "allocated", "freed"), fields):
            stats[f"{key}.all.{name}"] = c[field]
    for key in ("allocation", "active"):
        for name, value in (("current", c["live_count"]), ("peak", c["live_count_peak"]),
                            ("allocated", c["num_allocs"]), ("freed", c["num_frees"])):
            stats[f"{key}.all.{name}"] = value
    stats["segment.all.current"] = c["segment_count"]
    stats["segment.all.peak"] = c["segment_count_peak"]
    stats["allocation_requests"] = c["num_allocs"]
    stats["num_tensor_frees"] = c["num_frees"]
    stats["num_alloc_retries"] = c["num_alloc_retries"]
    stats["num_ooms"] = c["num_ooms"]
    stats["num_device_alloc"] = c["num_allocs"]
    stats["num_device_free"] = c["num_frees"]
    return dict(sorted(stats.items()))


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors."""
    return _C._memory_counters(_checked(device))["allocated_current"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since start or the last reset."""
    return _C._memory_counters(_checked(device))["allocated_peak"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds on the core (live blocks and its cache)."""
    return _C._memory_counters(_checked(device))["reserved_current"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved."""
    return _C._memory_counters(_checked(device))["reserved_peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Reset the peaks to the current values."""
    _C._reset_peak(_checked(device))


def reset_max_memory_allocated(device=None) -> None:
    """Alias of reset_peak_memory_stats."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Reset the allocated/freed totals and the counters."""
    _C._reset_accumulated(_checked(device))


def empty_cache() -> None:
    """Return the freed blocks the allocator keeps for reuse to the cores."""
    _C._empty_cache()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the logical NeuronCore's HBM."""
    c = _C._memory_counters(_checked(device))
    return c["capacity"] - c["reserved_current"], c["capacity"]


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of the device's memory statistics."""
    idx = _checked(device)
    c = _C._memory_counters(idx)
    rows = [
        ("Allocated memory", c["allocated_current"], c["allocated_peak"], c["allocated_total"], c["freed_total"]),
        ("Reserved memory", c["reserved_current"], c["reserved_peak"], c["reserved_total"], c["released_total"]),
    ]
    lines = [
        f"|{'=' * 75}|",
        f"| {'Neuron memory summary, device neuron:' + str(idx):<74}|",
        f"| {'HBM capacity: ' + _fmt(c['capacity']) + '   OOMs: ' + str(c['num_ooms']):<74}|",
        f"|{'-' * 75}|",
        f"| {'Metric':<22}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>10} | {'Tot Freed':>10} |",
        f"|{'-' * 75}|",
    ]
    for name, cur, peak, tot, freed in rows:
        lines.append(f"| {name:<22}| {_fmt(cur):>11} | {_fmt(peak):>11} | {_fmt(tot):>10} | {_fmt(freed):>10} |")
    lines.append(
        f"| {'Tensor allocations':<22}| {c['live_count']:>11} | {c['live_count_peak']:>11} | "
        f"{c['num_allocs']:>10} | {c['num_frees']:>10} |"
    )
    lines.append(f"|{'=' * 75}|")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- #
# Memory history and snapshots, as torch.cuda.memory's: the snapshot has the
# same format, so torch.cuda._memory_viz and https://pytorch.org/memory_viz
# read it.
# --------------------------------------------------------------------------- #
_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries: int = sys.maxsize,
                           device=None, clear_history: bool = False) -> None:
    """Start (or with ``enabled=None`` stop) recording neuron allocations with their stack traces.

    As ``torch.cuda.memory._record_memory_history``: ``enabled="state"`` keeps
    the stacks of live allocations, ``"all"`` also a trace of every alloc/free
    (the last ``max_entries`` per device). ``context`` picks which events get
    stacks (``"state"``/``"alloc"``: allocations, ``"all"``: frees too), and
    ``stacks="all"`` adds C++ frames to the Python ones. Every device is
    recorded; ``device`` is accepted for compatibility. Stopping discards the
    recorded history.
    """
    if enabled not in _ENABLED:
        raise ValueError(f"_record_memory_history: enabled must be one of {_ENABLED}, got {enabled!r}")
    if context not in _CONTEXT:
        raise ValueError(f"_record_memory_history: context must be one of {_CONTEXT}, got {context!r}")
    if stacks not in _STACKS:
        raise ValueError(f"_record_memory_history: stacks must be one of {_STACKS}, got {stacks!r}")
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"_record_memory_history: max_entries must be a positive int, got {max_entries!r}")
    if device is not None:
        _checked(device)
    _C._memory_record_history(
        enabled=enabled is not None,
        trace_alloc=enabled == "all",
        frames_alloc=context is not None,
        frames_free=context == "all",
        cpp=stacks == "all",
        max_entries=min(max_entries, 2**63 - 1),
        clear=clear_history,
    )


def _snapshot(device=None) -> dict:
    """The allocator's state and recorded history in the format of ``torch.cuda.memory._snapshot()``.

    ``segments`` lists every block the cores' allocators hold (live blocks with
    the stack that allocated them, if recorded; cached free blocks as
    ``inactive``), ``device_traces`` the recorded alloc/free_requested/
    free_completed/oom events per device.
    """
    if device is not None:
        _checked(device)
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle :func:`_snapshot` to ``filename`` (open it at https://pytorch.org/memory_viz)."""
    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)
