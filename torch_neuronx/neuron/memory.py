"""Device memory statistics of torch.neuron (per logical NeuronCore)."""
import collections

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
    _INNER = 79  # between a row's outer bars: 22-wide name, four 11-wide columns ("1023.00 MiB")
    idx = _checked(device)
    c = _C._memory_counters(idx)
    rows = [
        ("Allocated memory", c["allocated_current"], c["allocated_peak"], c["allocated_total"], c["freed_total"]),
        ("Reserved memory", c["reserved_current"], c["reserved_peak"], c["reserved_total"], c["released_total"]),
    ]
    lines = [
        f"|{'=' * _INNER}|",
        f"| {'Neuron memory summary, device neuron:' + str(idx):<{_INNER - 1}}|",
        f"| {'HBM capacity: ' + _fmt(c['capacity']) + '   OOMs: ' + str(c['num_ooms']):<{_INNER - 1}}|",
        f"|{'-' * _INNER}|",
        f"| {'Metric':<22}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11} |",
        f"|{'-' * _INNER}|",
    ]
    for name, cur, peak, tot, freed in rows:
        lines.append(f"| {name:<22}| {_fmt(cur):>11} | {_fmt(peak):>11} | {_fmt(tot):>11} | {_fmt(freed):>11} |")
    lines.append(
        f"| {'Tensor allocations':<22}| {c['live_count']:>11} | {c['live_count_peak']:>11} | "
        f"{c['num_allocs']:>11} | {c['num_frees']:>11} |"
    )
    lines.append(f"|{'=' * _INNER}|")
    return "\n".join(lines) + "\n"
