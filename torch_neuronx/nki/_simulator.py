"""Exact host execution of NKI kernels.

A kernel runs as ordinary Python: every ``nl``/``nisa`` call executes immediately on
NumPy arrays (rounded to the tile dtype), checks the hardware rules and charges its
cost to an engine. One :class:`KernelRun` holds the state of one launch (grid,
program ids, live on-chip allocations, cost ledger).
"""

import itertools
import threading
import weakref

import numpy as np
import torch

from . import _dtypes as dt
from ._cost_model import CostLedger
from ._errors import NKIContextError, NKIMemoryError
from ._rules import get_hardware
from ._tensor import NkiTensor, from_array

_state = threading.local()


def current_run(required=True):
    """The kernel launch being simulated on this thread."""
    run = getattr(_state, "run", None)
    if run is None and required:
        raise NKIContextError("this NKI API must be called inside a running @nki.jit kernel "
                              "(call the kernel, or use nki.simulate(kernel)(...))")
    return run


class KernelRun:
    """State of one kernel launch: hardware, grid position, allocator, cost ledger."""

    def __init__(self, hw, grid):
        self.hw = hw
        self.grid = grid
        self.program_id = (0,) * len(grid)
        self.ledger = CostLedger(hw)
        self.sbuf_live = 0  # bytes per partition
        self.psum_live = 0  # banks
        self.sbuf_peak = 0
        self.psum_peak = 0
        self._shared = []  # shared_hbm outputs, reused by every program of the grid
        self._shared_idx = 0

    # ----- on-chip allocator (freed when the tile object dies) ------------------
    def allocate(self, storage, shape, dtype, pdim):
        from ._rules import check_partition, check_psum_tile
        buffer = storage.buffer
        instr = f"nl.ndarray(buffer=nl.{buffer})"
        check_partition(self.hw, instr, storage.name, shape, pdim)
        blocks = int(np.prod(shape[:pdim], dtype=np.int64))
        tile_free = int(np.prod(shape[pdim + 1:], dtype=np.int64)) * dtype.itemsize
        if buffer == "psum":
            check_psum_tile(self.hw, instr, storage.name, shape, dtype, pdim)
            banks = blocks
            if self.psum_live + banks > self.hw.psum_num_banks:
                raise NKIMemoryError(
                    f"{instr}: operand '{storage.name}': PSUM capacity exceeded: "
                    f"{self.psum_live} banks live + {banks} requested > "
                    f"{self.hw.psum_num_banks} banks of {self.hw.psum_bank_bytes} bytes per "
                    f"partition ({self.hw.psum_bytes // 1024} KiB PSUM per core on {self.hw.name})")
            self.psum_live += banks
            self.psum_peak = max(self.psum_peak, self.psum_live)
            weakref.finalize(storage, self._free, "psum", banks)
        else:
            nbytes = blocks * tile_free
            cap = self.hw.sbuf_partition_bytes
            if self.sbuf_live + nbytes > cap:
                raise NKIMemoryError(
                    f"{instr}: operand '{storage.name}': SBUF capacity exceeded: "
                    f"{self.sbuf_live} + {nbytes} bytes per partition > {cap} bytes per "
                    f"partition ({self.hw.sbuf_bytes // (1024 * 1024)} MiB SBUF per core on "
                    f"{self.hw.name})")
            self.sbuf_live += nbytes
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            weakref.finalize(storage, self._free, "sbuf", nbytes)

    def _free(self, kind, amount):
        if kind == "psum":
            self.psum_live -= amount
        else:
            self.sbuf_live -= amount

    def shared_output(self, factory, shape, dtype):
        """All programs of a grid share ``nl.shared_hbm`` outputs (matched by order)."""
        if self._shared_idx < len(self._shared):
            t = self._shared[self._shared_idx]
            if t.shape != tuple(shape) or t.dtype is not dtype:
                raise NKIContextError(
                    "programs of one grid allocated different shared_hbm outputs "
                    f"({t.shape} {t.dtype!r} vs {tuple(shape)} {dtype!r})")
        else:
            t = factory()
            self._shared.append(t)
        self._shared_idx += 1
        return t


# ----- argument conversion --------------------------------------------------------
class _Arg:
    """A kernel argument converted to an HBM tensor, with how to convert results back."""

    def __init__(self, value, name):
        self.value = value
        self.kind = "other"
        self.tensor = None
        if isinstance(value, torch.Tensor):
            self.kind = "torch"
            d = dt.as_dtype(value.dtype)
            host = value.detach().to("cpu")
            host = host.float() if d.is_float else host
            arr = np.array(host.numpy(), dtype=d.np_storage, copy=True)
            self.tensor = from_array(arr, d, "hbm", name)
        elif isinstance(value, np.ndarray):
            self.kind = "numpy"
            d = dt.as_dtype(value.dtype)
            arr = np.array(value, dtype=d.np_storage, copy=True)
            self.tensor = from_array(arr, d, "hbm", name)

    def write_back(self):
        """Legacy kernels write outputs into arguments: copy those writes back."""
        if self.tensor is None or not self.tensor._storage.written:
            return
        if self.kind == "torch":
            self.value.copy_(_to_torch(self.tensor, self.value.device))
        else:
            self.value[...] = self.tensor._storage.data


def _to_torch(t, device):
    d = t.dtype
    host = torch.from_numpy(np.ascontiguousarray(t._storage.data))
    return host.to(d.torch_dtype).to(device)


def _to_numpy(t):
    return np.array(t._storage.data, copy=True)


def _kernel_param_names(fn, n):
    import inspect
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n)]


def run_kernel(fn, args, kwargs, grid=(), platform_target=None):
    """Execute ``fn`` for every program of ``grid``; return (outputs, CostReport)."""
    hw = get_hardware(platform_target)
    grid = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    names = _kernel_param_names(fn, len(args))
    conv = [_Arg(a, n) for a, n in zip(args, names)]
    kw_conv = {k: _Arg(v, k) for k, v in kwargs.items()}
    call_args = [c.tensor if c.tensor is not None else c.value for c in conv]
    call_kwargs = {k: (c.tensor if c.tensor is not None else c.value) for k, c in kw_conv.items()}
    run = KernelRun(hw, grid)
    prev = getattr(_state, "run", None)
    _state.run = run
    result = None
    try:
        for pid in (itertools.product(*[range(g) for g in grid]) if grid else [()]):
            run.program_id = pid
            run._shared_idx = 0
            result = fn(*call_args, **call_kwargs)
    finally:
        _state.run = prev
    report = run.ledger.report(sbuf_peak=run.sbuf_peak, psum_peak=run.psum_peak,
                               n_programs=int(np.prod(grid)) if grid else 1)
    all_args = conv + list(kw_conv.values())
    for c in all_args:
        c.write_back()
    torch_args = [c.value for c in all_args if c.kind == "torch"]
    device = torch_args[0].device if torch_args else None
    return _convert_result(result, device), report


def _convert_result(result, device):
    if isinstance(result, NkiTensor):
        return _to_torch(result, device) if device is not None else _to_numpy(result)
    if isinstance(result, (tuple, list)):
        return type(result)(_convert_result(r, device) for r in result)
    return result
