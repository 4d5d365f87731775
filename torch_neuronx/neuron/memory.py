"""Device memory statistics of torch.neuron (per logical NeuronCore).

Everything here reads the device allocator's DeviceStats through
torch.accelerator, so torch.neuron and torch.accelerator always agree.
"""
import torch

from .device import _checked

# Tensors hold "allocated" bytes (as requested); the core's caching allocator
# holds "reserved" bytes: live blocks rounded to their size class plus freed
# blocks (up to 64 MiB each) kept for reuse, which empty_cache() returns.


def memory_stats(device=None) -> dict:
    """Allocator statistics, CUDA-style flattened keys (e.g. ``allocated_bytes.all.current``)."""
    stats = torch._C._accelerator_getDeviceStats(_checked(device))
    flat = {}

    def flatten(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                flatten(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    flatten("", stats)
    return dict(sorted(flat.items()))


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated since start or the last reset."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds on the core (live blocks and its cache)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved."""
    return memory_stats(device)["reserved_bytes.all.peak"]


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
    idx = _checked(device)
    s = memory_stats(idx)
    _, capacity = mem_get_info(idx)

    def row(name, key):
        return (name,) + tuple(s[f"{key}.all.{f}"] for f in ("current", "peak", "allocated", "freed"))

    lines = [
        f"|{'=' * 75}|",
        f"| {'Neuron memory summary, device neuron:' + str(idx):<74}|",
        f"| {'HBM capacity: ' + _fmt(capacity) + '   OOMs: ' + str(s['num_ooms']):<74}|",
        f"|{'-' * 75}|",
        f"| {'Metric':<22}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>10} | {'Tot Freed':>10} |",
        f"|{'-' * 75}|",
    ]
    for name, cur, peak, tot, freed in (row("Allocated memory", "allocated_bytes"),
                                        row("Reserved memory", "reserved_bytes")):
        lines.append(f"| {name:<22}| {_fmt(cur):>11} | {_fmt(peak):>11} | {_fmt(tot):>10} | {_fmt(freed):>10} |")
    _, cur, peak, tot, freed = row("", "allocation")
    lines.append(f"| {'Tensor allocations':<22}| {cur:>11} | {peak:>11} | {tot:>10} | {freed:>10} |")
    lines.append(f"|{'=' * 75}|")
    return "\n".join(lines) + "\n"
