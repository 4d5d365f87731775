"""``@nki.jit`` kernels, launch grids and the simulate/benchmark entry points."""

import functools

from ._simulator import current_run, run_kernel


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
        k = Kernel(self.fn, grid, self.platform_target, **self.options)
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
        out, report = run_kernel(self.fn, args, kwargs, self.grid,
                                 platform_target or self.platform_target)
        self.last_report = report
        return out, report

    def cost_report(self):
        """The :class:`CostReport` of the last launch (None before the first)."""
        return self.last_report

    def __repr__(self):
        return f"<nki.jit kernel {self.fn.__name__} grid={self.grid}>"


def jit(fn=None, *, platform_target=None, mode=None, **options):
    """Decorate an NKI kernel. ``platform_target`` is ``"trn2"`` (default) or ``"trn3"``."""
    if fn is None:
        return lambda f: jit(f, platform_target=platform_target, mode=mode, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, platform_target=platform_target, **options)


def simulate(kernel, report=False, platform_target=None):
    """``nki.simulate(kernel)(*arrays)``: run on host; ``report=True`` also returns the cost."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    def runner(*args, **kwargs):
        out, rep = k.simulate(*args, platform_target=platform_target, **kwargs)
        return (out, rep) if report else out
    return runner


simulate_kernel = simulate


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


def benchmark(kernel=None, *, platform_target=None, **kwargs):
    """Like ``nki.benchmark``: calling the result runs the kernel once in the simulator and
    sets ``.benchmark_result.nc_latency.get_latency_percentile(50)`` (estimated us)."""
    if kernel is None:
        return lambda k: benchmark(k, platform_target=platform_target)
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    class _Bench:
        benchmark_result = None

        def __call__(self, *args, **kw):
            out, rep = k.simulate(*args, platform_target=platform_target, **kw)
            self.benchmark_result = _BenchmarkResult(rep)
            return out

        def __getitem__(self, grid):
            return benchmark(k[grid], platform_target=platform_target)
    return _Bench()
