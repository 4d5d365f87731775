"""Exact host execution of NKI kernels.

A kernel runs as ordinary Python: every ``nl``/``nisa`` call executes immediately on
NumPy arrays (rounded to the tile dtype), checks the hardware rules and charges its
cost to an engine. torch is only touched when a kernel is called with torch tensors.
"""

import inspect
import itertools
import sys

import numpy as np

from . import _dtypes as dt
from ._context import KernelRun, set_run
from ._ops import TensorView, from_array
from ._rules import get_hardware


def _is_torch_tensor(value):
    torch = sys.modules.get("torch")  # no torch loaded: no torch tensor exists
    return torch is not None and isinstance(value, torch.Tensor)


class _Arg:
    """A kernel argument converted to an HBM tensor, with how to convert results back."""

    def __init__(self, value, name):
        self.value = value
        self.kind = "other"
        self.tensor = None
        if _is_torch_tensor(value):
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
        self.tensor._sync_all()
        if self.kind == "torch":
            self.value.copy_(_to_torch(self.tensor, self.value.device))
        else:
            self.value[...] = self.tensor._storage.data


def _values(t):
    """The returned view's elements (a kernel may return a reshaped or sliced view)."""
    t._sync_all()
    return np.array(t._view if t._adv is None else t._view[t._adv], copy=True)


def _to_torch(t, device):
    host = dt._loaded_torch().from_numpy(np.ascontiguousarray(_values(t)))
    return host.to(t.dtype.torch_dtype).to(device)


def _to_numpy(t):
    return _values(t)


def _kernel_param_names(fn, n):
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n)]


def _common_device(values):
    """The one device of the torch tensor arguments; PyTorch's error if they differ."""
    devices = []
    for v in values:
        if _is_torch_tensor(v) and v.device not in devices:
            devices.append(v.device)
    if len(devices) > 1:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least "
            f"two devices, {devices[0]} and {devices[1]}!"
        )
    return devices[0] if devices else None


def run_kernel(fn, args, kwargs, grid=(), platform_target=None):
    """Execute ``fn`` for every program of ``grid``; return (outputs, CostReport)."""
    device = _common_device(list(args) + list(kwargs.values()))
    hw = get_hardware(platform_target)
    grid = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    names = _kernel_param_names(fn, len(args))
    conv = [_Arg(a, n) for a, n in zip(args, names)]
    kw_conv = {k: _Arg(v, k) for k, v in kwargs.items()}
    call_args = [c.tensor if c.tensor is not None else c.value for c in conv]
    call_kwargs = {k: (c.tensor if c.tensor is not None else c.value) for k, c in kw_conv.items()}
    run = KernelRun(hw, grid)
    prev = set_run(run)
    result = None
    try:
        for pid in itertools.product(*[range(g) for g in grid]) if grid else [()]:
            run.program_id = pid
            run._shared_idx = 0
            result = fn(*call_args, **call_kwargs)
            run.check_psum_liveness()
    finally:
        set_run(prev)
    report = run.ledger.report(
        sbuf_peak=run.sbuf_peak, psum_peak=run.psum_peak, n_programs=int(np.prod(grid)) if grid else 1
    )
    for c in conv + list(kw_conv.values()):
        c.write_back()
    return _convert_result(result, device), report


def _convert_result(result, device):
    if isinstance(result, TensorView):
        return _to_torch(result, device) if device is not None else _to_numpy(result)
    if isinstance(result, (tuple, list)):
        return type(result)(_convert_result(r, device) for r in result)
    return result
