"""``@nki.jit`` kernels, launch grids and the simulate/benchmark entry points."""

import functools
import warnings

from ._context import current_run
from ._simulator import run_kernel


def _grid_size(g):
    n = int(g)  # ints, and nl.spmd_dim / nl.nc objects (which define __int__)
    if n < 1:
        # zero programs would run nothing and return None: never a silent no-op launch
        raise ValueError(f"nki kernel launch grid: every dimension must be >= 1, got {n}")
    return n


class Kernel:
    """A jitted NKI kernel. Call it on torch tensors (cpu or neuron) or NumPy arrays.

    ``kernel[grid](...)`` launches an SPMD grid (``nl.program_id`` /
    ``nl.num_programs`` inside). The last launch's cost estimate is kept in
    :attr:`last_report` (see :meth:`cost_report`).
    """

    def __init__(self, fn, grid=(), platform_target=None, **options):
        self.fn = self.func = fn  # `func` is the attribute name the real nki.jit uses
        self.grid = grid
        self.platform_target = platform_target
        self.options = options
        self.last_report = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        k = Kernel(self.fn, tuple(_grid_size(g) for g in grid), self.platform_target, **self.options)
        k._parent = self
        return k

    def __call__(self, *args, **kwargs):
        if current_run(required=False) is not None:
            # a kernel called from inside a kernel is inlined (as NKI traces it)
            return self.fn(*args, **kwargs)
        out, report = run_kernel(self.fn, args, kwargs, self.grid, self.platform_target)
        self.last_report = report
        parent = getattr(self, "_parent", None)
        if parent is not None:
            parent.last_report = report
        return out

    def simulate(self, *args, platform_target=None, **kwargs):
        """Run in the simulator and return ``(outputs, CostReport)``."""
        out, report = run_kernel(self.fn, args, kwargs, self.grid, platform_target or self.platform_target)
        self.last_report = report
        return out, report

    def cost_report(self):
        """The :class:`CostReport` of the last launch (None before the first)."""
        return self.last_report

    def __repr__(self):
        return f"<nki.jit kernel {self.fn.__name__} grid={self.grid}>"


def jit(fn=None, *, platform_target=None, mode=None, **options):
    """Decorate an NKI kernel. ``platform_target`` is ``"trn2"`` or ``"trn3"`` (default:
    the chip of ``TORCH_NEURONX_INSTANCE_TYPE``, trn2 when unset)."""
    if fn is None:
        return lambda f: jit(f, platform_target=platform_target, mode=mode, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, platform_target=platform_target, **options)


def baremetal(fn=None, **options):
    """``nki.baremetal``: run a kernel on NumPy arrays (here: the simulator, as :func:`jit`)."""
    return jit(fn, **options)


def trace(fn=None, **options):
    """``nki.trace``: trace a kernel for ``nki.simulate_kernel`` (here: the same as :func:`jit`)."""
    return jit(fn, **options)


def simulate(kernel, report=False, platform_target=None):
    """``nki.simulate(kernel)(*arrays)``: run on host; ``report=True`` also returns the cost."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    def runner(*args, **kwargs):
        out, rep = k.simulate(*args, platform_target=platform_target, **kwargs)
        return (out, rep) if report else out

    return runner


def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel, *args)``: run the kernel on host, return its outputs."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k.simulate(*args, **kwargs)[0]


class _Latency:
    def __init__(self, seconds):
        self._us = seconds * 1e6

    def get_latency_percentile(self, p):
        """Estimated latency in microseconds (deterministic: equal for every percentile)."""
        return self._us


class _BenchmarkResult:
    def __init__(self, report):
        self.report = report
        self.nc_latency = _Latency(report.total_time_s)


_warned_no_neff = False


def _warn_no_neff():
    # AWS's tutorials pass save_neff_name; they should run unmodified, so say once what is missing.
    global _warned_no_neff
    if _warned_no_neff:
        return
    _warned_no_neff = True
    warnings.warn(
        "nki.benchmark(save_neff_name=...): the simulator does not compile kernels, so no NEFF file "
        "is written; the latency estimate is still set (save_trace_name= writes the simulated timeline)",
        UserWarning,
        stacklevel=3,
    )


def benchmark(
    kernel=None, *, warmup=None, iters=None, save_neff_name=None, save_trace_name=None, platform_target=None, **options
):
    """Like ``nki.benchmark``: calling the result runs the kernel once in the simulator and
    sets ``.benchmark_result.nc_latency.get_latency_percentile(50)`` (estimated us).

    ``save_trace_name`` writes the simulated engine timeline as a Chrome trace (JSON,
    open in ``chrome://tracing`` or Perfetto) whatever the file's extension. There is no
    compiler here, so ``save_neff_name`` writes nothing (a UserWarning says so, once).
    ``warmup``/``iters`` are accepted: the estimate is deterministic, so one run gives every
    percentile.
    """
    if save_neff_name is not None:
        _warn_no_neff()
    for name, v in (("warmup", warmup), ("iters", iters)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise ValueError(f"nki.benchmark: {name} must be a non-negative int, got {v!r}")
    unknown = sorted(set(options) - {"additional_compile_opt", "device_count"})
    if unknown:
        raise TypeError(f"nki.benchmark() got unexpected keyword argument(s) {unknown}")
    if options.get("additional_compile_opt"):
        raise NotImplementedError(
            "nki.benchmark(additional_compile_opt=...): there is no " "compiler in the simulator to pass options to"
        )
    if kernel is None:
        return lambda k: benchmark(
            k, warmup=warmup, iters=iters, save_trace_name=save_trace_name, platform_target=platform_target, **options
        )
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    class _Bench:
        benchmark_result = None

        def __call__(self, *args, **kw):
            out, rep = k.simulate(*args, platform_target=platform_target, **kw)
            self.benchmark_result = _BenchmarkResult(rep)
            if save_trace_name is not None:
                rep.save_chrome_trace(save_trace_name)
            return out

        def __getitem__(self, grid):
            return benchmark(
                k[grid], warmup=warmup, iters=iters, save_trace_name=save_trace_name, platform_target=platform_target
            )

    return _Bench()
