"""``nki.language`` (``nl``): tile-level NKI programming on the simulated NeuronCore.

Names and semantics follow AWS's public ``nki.language`` reference: tensors in
HBM/SBUF/PSUM, ``load``/``store``, index helpers, loop iterators, elementwise math,
reductions and matmul. Every call executes exactly on host and is charged to the
engine the real compiler would use (see ``_cost_model``).
"""

import builtins as _b

import numpy as np
import torch

from . import _dtypes as _dt
from . import _ops
from . import _rules as _r
from ._dtypes import (bfloat16, bool_, float8_e4m3, float8_e5m2, float16, float32,  # noqa: F401
                      int8, int16, int32, tfloat32, uint8, uint16, uint32)
from ._errors import NKIBufferError, NKIShapeError, _fail
from ._simulator import current_run
from ._tensor import NkiTensor, new_storage, par_dim  # noqa: F401

# ----- buffers (names of the memories a tensor lives in) ------------------------
hbm = "hbm"
shared_hbm = "shared_hbm"
private_hbm = "private_hbm"
sbuf = "sbuf"
psum = "psum"
_HBM = ("hbm", "shared_hbm", "private_hbm")


class tile_size:
    """Hardware tile size constants (NeuronCore-v3, trn2; PSUM/PE limits equal on trn3)."""

    pmax = _r.TRN2.pmax
    psum_fmax = _r.TRN2.psum_fmax
    psum_fmax_bytes = _r.TRN2.psum_bank_bytes
    psum_num_banks = _r.TRN2.psum_num_banks
    sbuf_size_bytes = _r.TRN2.sbuf_bytes
    sbuf_fmax_bytes = _r.TRN2.sbuf_partition_bytes
    sbuf_fmax = _r.TRN2.sbuf_partition_bytes // 4
    total_available_sbuf_size = _r.TRN2.sbuf_partition_bytes
    gemm_stationary_fmax = _r.TRN2.gemm_stationary_fmax
    gemm_moving_fmax = _r.TRN2.gemm_moving_fmax
    bn_stats_fmax = 512


# ----- tensor creation ----------------------------------------------------------
def ndarray(shape, dtype=float32, buffer=None, name=""):
    """Allocate a tensor of ``shape``/``dtype`` in ``buffer`` (default SBUF)."""
    return _create(shape, dtype, buffer, name, None)


def empty_like(a, dtype=None, buffer=None, name=""):
    return _create(a.shape, dtype or a.dtype, buffer or a.buffer, name, None)


def zeros(shape, dtype=float32, buffer=None, name=""):
    return _create(shape, dtype, buffer, name, 0)


def zeros_like(a, dtype=None, buffer=None, name=""):
    return _create(a.shape, dtype or a.dtype, buffer or a.buffer, name, 0)


def ones(shape, dtype=float32, buffer=None, name=""):
    return _create(shape, dtype, buffer, name, 1)


def full(shape, fill_value, dtype=float32, buffer=None, name=""):
    return _create(shape, dtype, buffer, name, fill_value)


def _create(shape, dtype, buffer, name, fill):
    run = current_run()
    buffer = sbuf if buffer is None else buffer
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = _dt.as_dtype(dtype)
    name = name or _ops._name(buffer)
    if buffer in _HBM:
        if fill is not None:
            _fail(NKIBufferError, "nl.zeros/ones/full", name,
                  "HBM tensors cannot be initialised by a compute engine; allocate with "
                  "nl.ndarray and nl.store into it")
        return run.shared_output(lambda: new_storage(shape, dtype, buffer, name), shape, dtype)
    t = new_storage(shape, dtype, buffer, name)
    if fill is not None:
        t._view[...] = _dt.round_to(np.asarray(fill), dtype)
        _ops.charge_elementwise("Vector", "nl.memset", tuple(int(s) for s in shape))
    return t


# ----- indices and iteration ------------------------------------------------------
def arange(*args):
    """Index vector for advanced indexing: ``nl.arange(128)[:, None]``."""
    return np.arange(*args)


class _Grid(tuple):
    @property
    def p(self):
        return self[0]

    @property
    def x(self):
        return self[1]

    @property
    def y(self):
        return self[2]

    @property
    def z(self):
        return self[3]


class _MGrid:
    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        return _Grid(np.ogrid[key])


mgrid = _MGrid()


def affine_range(*args, **kwargs):
    """Loop whose iterations are independent (the compiler may reorder/pipeline them)."""
    return range(*args)


def sequential_range(*args, **kwargs):
    """Loop with a loop-carried dependency (executed in order)."""
    return range(*args)


def static_range(*args, **kwargs):
    """Loop fully unrolled at trace time."""
    return range(*args)


def program_id(axis):
    """Index of this program along launch-grid ``axis``."""
    run = current_run()
    if not 0 <= axis < _b.max(len(run.grid), 1):
        raise IndexError(f"nl.program_id: axis {axis} out of range for grid {run.grid}")
    return run.program_id[axis] if run.grid else 0


def num_programs(axes=None):
    """Number of programs along ``axes`` (all axes when None)."""
    run = current_run()
    grid = run.grid or (1,)
    if axes is None:
        return int(np.prod(grid))
    if isinstance(axes, (tuple, list)):
        return int(np.prod([grid[a] for a in axes]))
    return grid[axes]


def program_ndim():
    return len(current_run().grid)


# ----- data movement ----------------------------------------------------------------
def load(src, mask=None, dtype=None, **kwargs):
    """DMA an HBM tensor (view) into a new SBUF tile."""
    instr = "nl.load"
    if not isinstance(src, NkiTensor):
        raise TypeError(f"{instr}: operand 'src' must be a tensor, got {type(src).__name__}")
    if src.buffer not in _HBM:
        _fail(NKIBufferError, instr, "src",
              f"tensor in {src.buffer.upper()}; nl.load reads HBM (tiles already on chip "
              f"need no load)")
    run = current_run()
    _r.check_partition(run.hw, instr, "result", src.shape)
    vals = src._read(instr, "src", mask)
    out = _ops.new_tile(vals, _dt.as_dtype(dtype) or src.dtype, instr)
    n = int(np.count_nonzero(np.broadcast_to(mask, src.shape))) if mask is not None \
        else int(np.prod(src.shape))
    _ops.charge_dma(instr, n * src.itemsize)
    return out


def store(dst, value, mask=None, **kwargs):
    """DMA an SBUF tile into an HBM tensor (view)."""
    instr = "nl.store"
    if not isinstance(dst, NkiTensor) or dst.buffer not in _HBM:
        where = dst.buffer.upper() if isinstance(dst, NkiTensor) else type(dst).__name__
        _fail(NKIBufferError, instr, "dst", f"destination in {where}; nl.store writes HBM")
    if isinstance(value, NkiTensor):
        if value.buffer == psum:
            _fail(NKIBufferError, instr, "value",
                  "tile in PSUM; DMA reads SBUF only: copy it to SBUF first (nl.copy)")
        vals, _, _ = _ops.operand(value, instr, "value", None, allowed=("sbuf",))
    else:
        vals = np.asarray(value)
    dst._write(instr, "dst", vals, mask)
    n = int(np.count_nonzero(np.broadcast_to(mask, dst.shape))) if mask is not None \
        else int(np.prod(dst.shape))
    _ops.charge_dma(instr, n * dst.itemsize)


def load_transpose2d(src, dtype=None, mask=None):
    """DMA a 2-D HBM tensor into SBUF transposed (the DMA engine does the transpose)."""
    t = load(src, mask=mask, dtype=dtype)
    vals = t._view.T.copy()
    del t
    return _ops.new_tile(vals, _dt.as_dtype(dtype) or src.dtype, "nl.load_transpose2d")


def copy(x, dtype=None, mask=None, **kwargs):
    """Copy a tile (e.g. PSUM -> SBUF), optionally casting."""
    return _ops.elementwise("nl.copy", "Vector", lambda a: a, [x], dtype, mask)


# ----- elementwise math ------------------------------------------------------------------
def _t(fn):
    def f(a):
        return fn(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))).numpy()
    return f


class _Op:
    """An elementwise function that is also usable as an ``op=`` of nki.isa calls."""

    def __init__(self, name, fn, engine, arity):
        self.__name__ = self.name = name
        self.fn = fn
        self.engine = engine
        self.arity = arity
        self.__doc__ = f"nl.{name}: elementwise, executed on the {engine} Engine."

    def __call__(self, *args, dtype=None, mask=None, **kwargs):
        if len(args) != self.arity:
            raise TypeError(f"nl.{self.name} takes {self.arity} tile argument(s)")
        return _ops.elementwise(f"nl.{self.name}", self.engine, self.fn, list(args), dtype, mask)

    def __repr__(self):
        return f"nl.{self.name}"


def _gelu(a):
    return torch.nn.functional.gelu(torch.from_numpy(np.ascontiguousarray(a, np.float32))).numpy()


def _gelu_tanh(a):
    return torch.nn.functional.gelu(torch.from_numpy(np.ascontiguousarray(a, np.float32)),
                                    approximate="tanh").numpy()


_UNARY_SCALAR = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a), "sigmoid": _t(torch.sigmoid),
    "relu": lambda a: np.maximum(a, 0), "gelu": _gelu, "gelu_apprx_tanh": _gelu_tanh,
    "silu": _t(torch.nn.functional.silu), "softplus": _t(torch.nn.functional.softplus),
    "mish": _t(torch.nn.functional.mish), "erf": _t(torch.special.erf),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "arctan": np.arctan,
    "square": np.square, "reciprocal": lambda a: 1.0 / a, "sign": np.sign,
    "abs": np.abs, "negative": np.negative, "ceil": np.ceil, "floor": np.floor,
    "trunc": np.trunc, "logical_not": np.logical_not, "invert": np.invert,
}
_VECTOR_UNARY = {"abs", "negative", "ceil", "floor", "trunc", "logical_not", "invert",
                 "reciprocal"}
_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "divide": np.divide, "power": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "fmod": np.fmod, "mod": np.mod, "equal": np.equal, "not_equal": np.not_equal,
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": np.right_shift,
}
for _n, _f in _UNARY_SCALAR.items():
    globals()[_n] = _Op(_n, _f, "Vector" if _n in _VECTOR_UNARY else "Scalar", 1)
for _n, _f in _BINARY.items():
    globals()[_n] = _Op(_n, _f, "Vector", 2)
del _n, _f
# aliases used in the public docs
gelu_dx = _Op("gelu_dx", _t(lambda x: torch.func.grad(
    lambda v: torch.nn.functional.gelu(v).sum())(x)), "Scalar", 1)


def where(condition, x, y, dtype=None, mask=None):
    """Select ``x`` where ``condition`` else ``y`` (Vector Engine)."""
    if isinstance(condition, np.ndarray) and not isinstance(condition, NkiTensor):
        return _ops.elementwise("nl.where", "Vector", lambda a, b: np.where(condition, a, b),
                                [x, y], dtype, mask, names=["x", "y"])
    return _ops.elementwise("nl.where", "Vector", np.where, [condition, x, y], dtype, mask,
                            names=["condition", "x", "y"])


def broadcast_to(x, shape):
    """Broadcast a tile to ``shape`` (a Vector copy)."""
    return _ops.elementwise("nl.broadcast_to", "Vector",
                            lambda a: np.broadcast_to(a, shape), [x])


# ----- reductions --------------------------------------------------------------------------
def _reduction(name, fn):
    def reduce(x, axis, dtype=None, keepdims=False, mask=None, **kwargs):
        instr = f"nl.{name}"
        a, d, _ = _ops.operand(x, instr, "x", mask)
        _r.check_free_axes(instr, "x", axis, a.ndim)
        ax = tuple(axis) if isinstance(axis, (list, tuple)) else axis
        with np.errstate(all="ignore"):
            vals = fn(a.astype(np.float32) if a.dtype.kind == "f" else a, axis=ax,
                      keepdims=keepdims)
        _ops.charge_elementwise("Vector", instr, a.shape)
        out_d = _dt.as_dtype(dtype) or (d if name not in ("all", "any") else bool_)
        return _ops.new_tile(vals, out_d, instr)
    reduce.__name__ = name
    reduce.__doc__ = f"nl.{name} along free axes (Vector Engine)."
    return reduce


sum = _reduction("sum", np.sum)  # noqa: A001
max = _reduction("max", np.max)  # noqa: A001
min = _reduction("min", np.min)  # noqa: A001
mean = _reduction("mean", np.mean)
prod = _reduction("prod", np.prod)
all = _reduction("all", np.all)  # noqa: A001
any = _reduction("any", np.any)  # noqa: A001
var = _reduction("var", np.var)


def softmax(x, axis, dtype=None, mask=None):
    """Softmax along a free axis: max/sub/sum on Vector, exp on Scalar."""
    instr = "nl.softmax"
    a, d, _ = _ops.operand(x, instr, "x", mask)
    _r.check_free_axes(instr, "x", axis, a.ndim)
    a = a.astype(np.float32)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    vals = e / e.sum(axis=axis, keepdims=True)
    _ops.charge_elementwise("Vector", instr, a.shape, n_passes=3)
    _ops.charge_elementwise("Scalar", instr, a.shape)
    return _ops.new_tile(vals, _dt.as_dtype(dtype) or d, instr)


# ----- Tensor Engine -------------------------------------------------------------------------
def matmul(x, y, transpose_x=False, mask=None, **kwargs):
    """``x @ y`` on the Tensor Engine into a new PSUM fp32 tile.

    ``x`` is [M, K] (or [K, M] with ``transpose_x=True``, the layout the Tensor Engine
    uses natively as the stationary operand), ``y`` is [K, N]. K <= 128, M <= 128,
    N <= 512.
    """
    from . import isa
    instr = "nl.matmul"
    if not isinstance(x, NkiTensor) or not isinstance(y, NkiTensor):
        raise TypeError(f"{instr}: operands must be tiles")
    if transpose_x:
        return isa._matmul(instr, x, y, name_st="x", name_mv="y")
    if x.ndim != 2:
        _fail(NKIShapeError, instr, "x", f"must be a 2-D tile, got shape {x.shape}")
    xt = isa._transpose_pe(instr, x, "x")  # the compiler inserts a PE transpose
    xs = _ops.new_tile(xt._view, x.dtype, instr)
    del xt
    return isa._matmul(instr, xs, y, name_st="x", name_mv="y")


def transpose(x, dtype=None, mask=None, **kwargs):
    """2-D transpose [P, F] -> [F, P] on the Tensor Engine (result in PSUM)."""
    return _transpose_and_cast(x, dtype)


def _transpose_and_cast(x, dtype):
    from . import isa
    t = isa._transpose_pe("nl.transpose", x, "x")
    if dtype is not None and _dt.as_dtype(dtype) is not t.dtype:
        t2 = _ops.new_tile(t._view, _dt.as_dtype(dtype), "nl.transpose", buffer=psum)
        return t2
    return t


# ----- misc -------------------------------------------------------------------------------------
def device_print(prefix, x):
    """Print a tile's values from inside the kernel (simulator only)."""
    vals = x._read("nl.device_print", "x") if isinstance(x, NkiTensor) else x
    print(prefix, vals)


def static_assert(cond, msg=""):
    if not cond:
        raise AssertionError(msg)

