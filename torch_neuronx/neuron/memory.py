"""Device memory statistics of torch.neuron (per logical NeuronCore).

The statistics read the device allocator's DeviceStats through
torch.accelerator, so torch.neuron and torch.accelerator always agree. The
memory history and snapshots (at the end) come from the device core.
"""

import pickle
import sys

import torch

from .. import _C
from .device import _checked, _index

# Tensors hold "allocated" bytes (as requested); the core's caching allocator
# holds "reserved" bytes: live blocks rounded to their size class plus freed
# blocks (up to 64 MiB each) kept for reuse, which empty_cache() returns.


def _device_stats(device=None) -> dict:
    """The allocator's nested statistics (``["allocated_bytes"]["all"]["current"]``), which
    memory_stats flattens: a seventh of its cost, for readers of single counters."""
    return torch._C._accelerator_getDeviceStats(_checked(device))


def _in_use(device=None) -> tuple:
    """(allocated, reserved) bytes on a core now, read from the core without building
    _device_stats's dict (its cost: see _C._memory_in_use), for readers that sample per op."""
    return _C._memory_in_use(_index(device))  # the core checks the index


def _high_water(device=None) -> tuple:
    """(allocated, reserved) peak bytes on a core since _reset_high_water, which the program's own
    resets of its peak statistics leave alone (a recording's view of the peak)."""
    return _C._memory_high_water(_index(device))


def _reset_high_water(device=None) -> None:
    _C._reset_memory_high_water(_index(device))


def memory_stats(device=None) -> dict:
    """Allocator statistics, CUDA-style flattened keys (e.g. ``allocated_bytes.all.current``)."""
    stats = _device_stats(device)
    flat = {}

    def flatten(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                flatten(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    flatten("", stats)
    # The real TorchNeuron's names of two counters that CUDA's keys also carry.
    flat["allocation_requests"] = flat["allocation.all.allocated"]
    flat["num_tensor_frees"] = flat["allocation.all.freed"]
    return dict(sorted(flat.items()))


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors."""
    return _device_stats(device)["allocated_bytes"]["all"]["current"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since start or the last reset."""
    return _device_stats(device)["allocated_bytes"]["all"]["peak"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds on the core (live blocks and its cache)."""
    return _device_stats(device)["reserved_bytes"]["all"]["current"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved."""
    return _device_stats(device)["reserved_bytes"]["all"]["peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Reset the peaks to the current values."""
    torch.accelerator.reset_peak_memory_stats(_checked(device))


def reset_max_memory_allocated(device=None) -> None:
    """Alias of reset_peak_memory_stats."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Reset the allocated/freed totals and the counters."""
    torch.accelerator.reset_accumulated_memory_stats(_checked(device))


def empty_cache() -> None:
    """Return the freed blocks the allocator keeps for reuse to the cores."""
    torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the logical NeuronCore's HBM."""
    return torch.accelerator.get_memory_info(_checked(device))


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of the device's memory statistics."""
    _INNER = 79  # between a row's outer bars: 22-wide name, four 11-wide columns ("1023.00 MiB")
    idx = _checked(device)
    s = memory_stats(idx)
    _, capacity = mem_get_info(idx)

    def row(name, key):
        return (name,) + tuple(s[f"{key}.all.{f}"] for f in ("current", "peak", "allocated", "freed"))

    lines = [
        f"|{'=' * _INNER}|",
        f"| {'Neuron memory summary, device neuron:' + str(idx):<{_INNER - 1}}|",
        f"| {'HBM capacity: ' + _fmt(capacity) + '   OOMs: ' + str(s['num_ooms']):<{_INNER - 1}}|",
        f"|{'-' * _INNER}|",
        f"| {'Metric':<22}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11} |",
        f"|{'-' * _INNER}|",
    ]
    for name, cur, peak, tot, freed in (
        row("Allocated memory", "allocated_bytes"),
        row("Reserved memory", "reserved_bytes"),
    ):
        lines.append(f"| {name:<22}| {_fmt(cur):>11} | {_fmt(peak):>11} | {_fmt(tot):>11} | {_fmt(freed):>11} |")
    _, cur, peak, tot, freed = row("", "allocation")
    lines.append(f"| {'Tensor allocations':<22}| {cur:>11} | {peak:>11} | {tot:>11} | {freed:>11} |")
    lines.append(f"|{'=' * _INNER}|")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- #
# Memory history and snapshots, as torch.cuda.memory's: the snapshot has the
# same format, so torch.cuda._memory_viz and https://pytorch.org/memory_viz
# read it.
# --------------------------------------------------------------------------- #
_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")


def _record_memory_history(
    enabled="all", context="all", stacks="all", max_entries: int = sys.maxsize, device=None, clear_history: bool = False
) -> None:
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
