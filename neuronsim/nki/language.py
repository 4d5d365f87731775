"""``nki.language`` (``nl``): tile-level NKI programming on the simulated NeuronCore.

Names and semantics follow AWS's public ``nki.language`` reference: tensors in
HBM/SBUF/PSUM, ``load``/``store``, index helpers, loop iterators, elementwise math,
reductions and matmul. Every call executes exactly on host and is charged to the
engine the real compiler would use (see ``_cost_model``). NumPy only: no torch.
"""

import builtins as _b

import numpy as np

from . import _callsite, _kwcheck, _math, _ops
from . import _dtypes as _dt
from . import _rules as _r
from ._context import current_run
from ._dtypes import (  # noqa: F401
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from ._errors import NKIBufferError, NKIShapeError, _fail
from ._ops import NkiTensor, new_storage  # noqa: F401
from ._tensor import par_dim  # noqa: F401

# ----- buffers (names of the memories a tensor lives in) ------------------------
hbm = "hbm"
shared_hbm = "shared_hbm"
private_hbm = "private_hbm"
sbuf = "sbuf"
psum = "psum"
_HBM = ("hbm", "shared_hbm", "private_hbm")


class _Unpublished:
    """A ``tile_size`` constant AWS documents but does not publish a value for."""

    def __init__(self, name):
        self.name = name

    def __get__(self, obj, cls=None):
        raise NotImplementedError(
            f"nl.tile_size.{self.name}: AWS does not publish this alignment, so the "
            f"simulator cannot provide it faithfully; use a value from your hardware's "
            f"compiler documentation"
        )


class tile_size:
    """Hardware tile size constants (NeuronCore-v3/v4: equal on trn2 and trn3)."""

    pmax = _r.TRN2.pmax
    psum_bank_fmax = _r.TRN2.psum_fmax
    psum_fmax = psum_bank_fmax  # deprecated name of psum_bank_fmax
    psum_bank_fmax_bytes = _r.TRN2.psum_bank_bytes
    psum_fmax_bytes = psum_bank_fmax_bytes
    psum_num_banks = _r.TRN2.psum_num_banks
    sbuf_size_bytes = _r.TRN2.sbuf_bytes
    sbuf_fmax_bytes = _r.TRN2.sbuf_partition_bytes
    sbuf_fmax = _r.TRN2.sbuf_partition_bytes // 4
    total_available_sbuf_size = _r.TRN2.sbuf_partition_bytes
    gemm_stationary_fmax = _r.TRN2.gemm_stationary_fmax
    gemm_moving_fmax = _r.TRN2.gemm_moving_fmax
    bn_stats_fmax = 512
    psum_min_align = _Unpublished("psum_min_align")
    sbuf_min_align = _Unpublished("sbuf_min_align")


class fp32:
    """Limits of float32 (``nl.fp32.min`` is the most negative finite value)."""

    min = float(np.finfo(np.float32).min)
    max = float(np.finfo(np.float32).max)


# ----- tensor creation ----------------------------------------------------------
def ndarray(shape, dtype=float32, buffer=None, name=""):
    """Allocate an uninitialised tensor of ``shape``/``dtype`` in ``buffer`` (default SBUF).

    Reading an element before anything wrote it raises ``NKIUninitializedError``.
    """
    return _create(shape, dtype, buffer, name, None)


def empty_like(a, dtype=None, buffer=None, name=""):
    return _create(a.shape, dtype or a.dtype, buffer or a.buffer, name, None)


def zeros(shape, dtype=float32, buffer=None, name="", lazy_initialization=False):
    """A tensor filled with 0. ``lazy_initialization`` lets the compiler fold the fill into
    the first write; the values are the same, so it is accepted and changes nothing."""
    return _create(shape, dtype, buffer, name, 0)


def zeros_like(a, dtype=None, buffer=None, name=""):
    return _create(a.shape, dtype or a.dtype, buffer or a.buffer, name, 0)


def ones(shape, dtype=float32, buffer=None, name="", lazy_initialization=False):
    """A tensor filled with 1 (``lazy_initialization``: see :func:`zeros`)."""
    return _create(shape, dtype, buffer, name, 1)


def full(shape, fill_value, dtype=float32, buffer=None, name="", lazy_initialization=False):
    """A tensor filled with ``fill_value`` (``lazy_initialization``: see :func:`zeros`)."""
    return _create(shape, dtype, buffer, name, fill_value)


def _create(shape, dtype, buffer, name, fill):
    run = current_run()
    buffer = sbuf if buffer is None else buffer
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = _dt.as_dtype(dtype)
    name = name or _ops._name(buffer)
    if buffer in _HBM:
        if fill is not None:
            _fail(
                NKIBufferError,
                "nl.zeros/ones/full",
                name,
                "HBM tensors cannot be initialised by a compute engine; allocate with "
                "nl.ndarray and nl.store into it",
            )
        return run.shared_output(lambda: new_storage(shape, dtype, buffer, name), shape, dtype)
    t = new_storage(shape, dtype, buffer, name)
    if fill is not None:
        t._write("nl.memset", "dst", np.asarray(fill))
        _ops.charge_elementwise("Vector", "nl.memset", tuple(int(s) for s in shape), n_inputs=0, dtypes=[dtype])
    return t


def shared_constant(constant, dtype=None):
    """An HBM tensor holding ``constant`` (a NumPy array or a ``.npy`` path)."""
    arr = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    d = _dt.as_dtype(dtype) or _dt.as_dtype(arr.dtype)
    t = new_storage(arr.shape, d, shared_hbm, _ops._name("shared_constant"), initialised=True)
    t._write("nl.shared_constant", "constant", arr)
    return t


def shared_identity_matrix(n, dtype=uint8, dst=None, name=None):
    """An [n, n] identity matrix in SBUF (``dst`` if given)."""
    d = _dt.as_dtype(dtype)
    eye = np.eye(n, dtype=np.float32)
    if dst is not None:
        dst._write("nl.shared_identity_matrix", "dst", eye)
        return dst
    t = new_storage((n, n), d, sbuf, _ops._name("identity"))
    t._write("nl.shared_identity_matrix", "result", eye)
    return t


# ----- indices and iteration ------------------------------------------------------
def arange(*args):
    """Index vector for advanced indexing: ``nl.arange(128)[:, None]``."""
    return np.arange(*args)


def ds(start, size, step=1):
    """A dynamic slice ``start : start + size`` (``t[:, nl.ds(i * 128, 128)]``)."""
    start, size = int(start), int(size)
    return slice(start, start + size * step, step) if step != 1 else slice(start, start + size)


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


def affine_range(*args, directives=None, precise_schedule=False):
    """Loop whose iterations are independent (the compiler may reorder/pipeline them).
    ``directives`` (e.g. ``nki.compiler.no_reorder()``) and ``precise_schedule`` are scheduling hints: the
    simulator runs in order. NKI traces the body once: see :meth:`KernelRun.traced_loop`."""
    return _traced(range(*args))


def sequential_range(*args, directives=None, precise_schedule=False):
    """Loop with a loop-carried dependency (executed in order). ``directives`` (e.g.
    ``nki.compiler.no_reorder()``) and ``precise_schedule`` are scheduling hints: the
    simulator runs in order. NKI traces the body once: see :meth:`KernelRun.traced_loop`."""
    return _traced(range(*args))


def _traced(r):
    run = current_run(required=False)
    return r if run is None else run.traced_loop(r)


def static_range(*args, directives=None):
    """Loop fully unrolled at trace time. ``directives`` (e.g.
    ``nki.compiler.no_reorder()``) are scheduling hints: the simulator runs in order."""
    return range(*args)


def program_id(axis=0):
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


class _SpmdDim:
    """A launch-grid dimension: ``kernel[nl.spmd_dim(2, nl.nc(2))]``.

    On one simulated NeuronCore the programs of every dimension run in sequence; the
    grid size is the product of the arguments.
    """

    def __init__(self, *sizes):
        self.size = int(np.prod([int(s) for s in sizes]))

    def __int__(self):
        return self.size

    __index__ = __int__

    def __mul__(self, other):
        return _SpmdDim(self.size, int(other))

    __rmul__ = __mul__


def spmd_dim(*sizes):
    """A grid dimension made of ``sizes`` (e.g. ``nl.spmd_dim(4, nl.nc(2))``)."""
    return _SpmdDim(*sizes)


def nc(n):
    """``n`` logical NeuronCores in a launch grid; simulated as ``n`` programs."""
    return _SpmdDim(n)


# ----- data movement ----------------------------------------------------------------
def load(src, mask=None, dtype=None, name=None):
    """DMA an HBM tensor (view) into a new SBUF tile."""
    instr = "nl.load"
    if not isinstance(src, NkiTensor):
        raise TypeError(f"{instr}: operand 'src' must be a tensor, got {type(src).__name__}")
    if src.buffer not in _HBM:
        _fail(
            NKIBufferError,
            instr,
            "src",
            f"tensor in {src.buffer.upper()}; nl.load reads HBM (tiles already on chip " f"need no load)",
        )
    run = current_run()
    _r.check_partition(run.hw, instr, "result", src.shape)
    vals = src._read(instr, "src", mask)
    shape = src.shape if src.ndim >= 2 else (src.shape + (1,) if src.ndim == 1 else (1, 1))
    out = _ops.new_tile(np.reshape(vals, shape), _dt.as_dtype(dtype) or src.dtype, instr)
    n = int(np.count_nonzero(np.broadcast_to(mask, src.shape))) if mask is not None else int(np.prod(src.shape))
    _ops.charge_dma(instr, n * src.itemsize)
    return out


def store(dst, value, mask=None, name=None):
    """DMA an SBUF tile into an HBM tensor (view); bytes are counted in ``dst``'s dtype."""
    instr = "nl.store"
    if not isinstance(dst, NkiTensor) or dst.buffer not in _HBM:
        where = dst.buffer.upper() if isinstance(dst, NkiTensor) else type(dst).__name__
        _fail(NKIBufferError, instr, "dst", f"destination in {where}; nl.store writes HBM")
    if isinstance(value, NkiTensor):
        if value.buffer == psum:
            # DMA engines read SBUF only: the compiler copies the PSUM tile to SBUF first
            _ops.charge_elementwise("Vector", "nl.store (PSUM -> SBUF copy)", value.shape, dtypes=[value.dtype])
        vals, _, _ = _ops.operand(value, instr, "value", mask)
    else:
        vals = np.asarray(value)
    dst._write(instr, "dst", vals, mask)
    n = int(np.count_nonzero(np.broadcast_to(mask, dst.shape))) if mask is not None else int(np.prod(dst.shape))
    _ops.charge_dma(instr, n * dst.itemsize)


def load_transpose2d(src, dtype=None, mask=None):
    """DMA a 2-D HBM tensor into SBUF transposed (the DMA engine does the transpose)."""
    instr = "nl.load_transpose2d"
    if not isinstance(src, NkiTensor) or src.buffer not in _HBM or src.ndim != 2:
        _fail(NKIBufferError, instr, "src", "must be a 2-D HBM tensor (view)")
    vals = np.asarray(src._read(instr, "src", mask)).T
    if mask is not None:
        vals = np.where(np.broadcast_to(mask, src.shape).T, vals, 0)
    out = _ops.new_tile(vals, _dt.as_dtype(dtype) or src.dtype, instr)
    n = int(np.count_nonzero(np.broadcast_to(mask, src.shape))) if mask is not None else int(np.prod(src.shape))
    _ops.charge_dma(instr, n * src.itemsize)
    return out


def gather_flattened(data, indices, axis=0, dtype=None, mask=None):
    """``out[p, i] = data[p, indices[p, i]]`` over data's flattened free axes (GpSimd)."""
    instr = "nl.gather_flattened"
    a, d, _ = _ops.operand(data, instr, "data")
    idx, di, _ = _ops.operand(indices, instr, "indices", mask)
    if di is None or di.kind not in "iu":
        _fail(NKIShapeError, instr, "indices", "must be an integer tile")
    flat = a.reshape(a.shape[0], -1)
    ix = idx.reshape(idx.shape[0], -1).astype(np.int64)
    if ix.shape[0] != flat.shape[0]:
        _fail(NKIShapeError, instr, "indices", f"partition size {ix.shape[0]} differs from data's {flat.shape[0]}")
    bad = (ix < 0) | (ix >= flat.shape[1])
    if mask is not None:
        bad &= np.broadcast_to(np.asarray(mask, bool), idx.shape).reshape(ix.shape)
    if bad.any():
        _fail(
            NKIShapeError,
            instr,
            "indices",
            f"index {int(ix[bad][0])} out of range for {flat.shape[1]} elements per partition",
        )
    vals = np.take_along_axis(flat, np.clip(ix, 0, flat.shape[1] - 1), axis=1)
    _ops.charge_elementwise("GpSimd", instr, idx.shape)
    return _ops.new_tile(vals.reshape(idx.shape), _dt.as_dtype(dtype) or d, instr)


# ----- elementwise math ------------------------------------------------------------------
Op = _ops.Op
for _n, _f in _math.UNARY.items():
    globals()[_n] = Op(_n, _f, "Vector" if _n in _math.VECTOR_UNARY else "Scalar", 1)
for _n, _f in _math.BINARY.items():
    globals()[_n] = Op(_n, _f, "Vector", 2)
del _n, _f


def where(condition, x, y, dtype=None, mask=None):
    """Select ``x`` where ``condition`` else ``y`` (Vector Engine)."""
    if isinstance(condition, np.ndarray) and not isinstance(condition, NkiTensor):
        return _ops.elementwise(
            "nl.where", "Vector", lambda a, b: np.where(condition, a, b), [x, y], dtype, mask, names=["x", "y"]
        )
    return _ops.elementwise(
        "nl.where", "Vector", np.where, [condition, x, y], dtype, mask, names=["condition", "x", "y"]
    )


def broadcast_to(x, shape, dtype=None):
    """Broadcast a tile to ``shape`` along its size-1 axes (a Vector copy)."""
    shape = tuple(int(s) for s in shape)
    if isinstance(x, NkiTensor) and x.ndim != len(shape):
        _fail(
            NKIShapeError,
            "nl.broadcast_to",
            "x",
            f"shape {x.shape} and target {shape} differ in rank; use nl.expand_dims first",
        )
    return _ops.elementwise("nl.broadcast_to", "Vector", lambda a: _ops.align(a, shape), [x], dtype)


def expand_dims(x, axis):
    """A view of tile ``x`` with a new size-1 axis at ``axis`` (no data movement)."""
    if not isinstance(x, NkiTensor):
        raise TypeError("nl.expand_dims: operand 'x' must be a tile")
    nd = x.ndim + 1
    ax = axis + nd if axis < 0 else axis
    if not 0 < ax < nd:
        _fail(
            NKIShapeError,
            "nl.expand_dims",
            "x",
            f"axis {axis} must be a free axis (1..{nd - 1}): the partition axis stays first",
        )
    if x._adv is not None:
        _fail(NKIShapeError, "nl.expand_dims", "x", "needs a tile, not an index-array view")
    view = np.expand_dims(x._view, ax)
    init = None if x._init is None else np.expand_dims(x._init, ax)
    return NkiTensor(x._storage, view, x._pdim, oob=x._oob, init=init)


def dropout(x, rate, dtype=None, mask=None):
    """Zero each element with probability ``rate`` (scalar or [P, 1] tile); no rescale.

    Random bits come from NumPy's generator (seed with ``nl.random_seed``): the
    hardware's random stream is not reproduced.
    """
    instr = "nl.dropout"
    a, d, _ = _ops.operand(x, instr, "x", mask)
    r, _, rt = _ops.operand(rate, instr, "rate")
    r = np.asarray(r, np.float32)
    if rt is not None:
        r = r.reshape(r.shape[0], *([1] * (a.ndim - 1)))
    keep = _rng().random(a.shape) >= r
    _ops.charge_elementwise("Vector", instr, a.shape, dtypes=[d])
    return _ops.new_tile(np.where(keep, a, 0), _dt.as_dtype(dtype) or d, instr)


_RNG = [None]


def _rng():
    if _RNG[0] is None:
        _RNG[0] = np.random.default_rng()
    return _RNG[0]


def random_seed(seed):
    """Seed the simulator's random generator (nl.rand, nl.dropout, nisa.dropout)."""
    s = seed._read("nl.random_seed", "seed") if isinstance(seed, NkiTensor) else seed
    _RNG[0] = np.random.default_rng(int(np.asarray(s).ravel()[0]))


def rand(shape, dtype=float32, buffer=None, name=""):
    """A tile of uniform random values in [0, 1)."""
    t = new_storage(tuple(shape), dtype, buffer or sbuf, name or _ops._name("rand"))
    t._write("nl.rand", "result", _rng().random(tuple(shape)))
    _ops.charge_elementwise("GpSimd", "nl.rand", tuple(shape))
    return t


# ----- reductions --------------------------------------------------------------------------
def _reduction(name, ufunc, post=None):
    def reduce(x, axis, dtype=None, keepdims=False, mask=None):
        instr = f"nl.{name}"
        vals, d = _ops.reduce(instr, ufunc, x, axis, keepdims=keepdims, mask=mask)
        if post is not None:
            vals = post(vals, x, axis, mask)
        out_d = _dt.as_dtype(dtype) or (d if name not in ("all", "any") else bool_)
        return _ops.new_tile(vals, out_d, instr)

    reduce.__name__ = name
    reduce.reduce_ufunc = ufunc
    reduce.__doc__ = (
        f"nl.{name} along free axes (Vector Engine). Without keepdims, reducing "
        f"every free axis gives a [P, 1] tile (the partition axis stays)."
    )
    return reduce


def _count(x, axis, mask):
    shape = x.shape if len(x.shape) >= 2 else tuple(x.shape) + (1,)
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if mask is None:
        return float(np.prod([shape[a] for a in axes]))
    m = np.broadcast_to(np.asarray(mask, bool), shape)
    return m.sum(axis=axes)


def _mean_post(vals, x, axis, mask):
    n = _count(x, axis, mask)
    return vals / np.reshape(n, vals.shape) if np.ndim(n) else vals / n


def _var(x, axis, dtype=None, keepdims=False, mask=None):
    instr = "nl.var"
    mu, d = _ops.reduce(instr, np.add, x, axis, keepdims=True, mask=mask)
    a, _, _ = _ops.operand(x, instr, "x", mask)
    a = a.reshape(mu.shape[:1] + a.shape[1:]) if a.ndim >= 2 else a.reshape(-1, 1)
    n = _count(x, axis, mask)
    mu = mu / (np.reshape(n, mu.shape) if np.ndim(n) else n)
    dev = (a.astype(np.float32) - mu) ** 2
    if mask is not None:
        dev = np.where(np.broadcast_to(np.asarray(mask, bool), dev.shape), dev, 0)
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    v = dev.sum(axis=axes, keepdims=True) / (np.reshape(n, mu.shape) if np.ndim(n) else n)
    if not keepdims:
        keep = [s for i, s in enumerate(v.shape) if i not in axes]
        v = v.reshape(keep if len(keep) > 1 else (v.shape[0], 1))
    return _ops.new_tile(v, _dt.as_dtype(dtype) or d, instr)


sum = _reduction("sum", np.add)  # noqa: A001
max = _reduction("max", np.maximum)  # noqa: A001
min = _reduction("min", np.minimum)  # noqa: A001
mean = _reduction("mean", np.add, _mean_post)
prod = _reduction("prod", np.multiply)
all = _reduction("all", np.logical_and)  # noqa: A001
any = _reduction("any", np.logical_or)  # noqa: A001
var = _var


def softmax(x, axis=-1, dtype=None, mask=None):
    """Softmax along a free axis: max/sub/sum on Vector, exp on Scalar."""
    instr = "nl.softmax"
    a, d, _ = _ops.operand(x, instr, "x", mask)
    _r.check_free_axes(instr, "x", axis, a.ndim)
    a = a.astype(np.float32)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    vals = e / e.sum(axis=axis, keepdims=True)
    _ops.charge_elementwise("Vector", instr, a.shape, n_inputs=3, dtypes=[d])
    _ops.charge_elementwise("Scalar", instr, a.shape)
    return _ops.new_tile(vals, _dt.as_dtype(dtype) or d, instr)


# ----- Tensor Engine -------------------------------------------------------------------------
def matmul(x, y, transpose_x=False, mask=None):
    """``x @ y`` on the Tensor Engine into a new PSUM fp32 tile.

    ``x`` is [M, K] (or [K, M] with ``transpose_x=True``, the layout the Tensor Engine
    uses natively as the stationary operand), ``y`` is [K, N]. K <= 128, M <= 128,
    N <= 512.
    """
    return _ops.matmul_nt("nl.matmul", x, y, transpose_x)


def transpose(x, dtype=None, mask=None):
    """2-D transpose [P, F] -> [F, P] on the Tensor Engine (result in PSUM)."""
    t = _ops.transpose_pe("nl.transpose", x, "x")
    if dtype is not None and _dt.as_dtype(dtype) is not t.dtype:
        return _ops.new_tile(t._view, _dt.as_dtype(dtype), "nl.transpose", buffer=psum)
    return t


# ----- loop reductions ----------------------------------------------------------------------
_NUMPY_REDUCTIONS = {np.sum: np.add, np.prod: np.multiply, np.max: np.maximum, np.min: np.minimum}
_COMMUTATIVE = (np.add, np.multiply, np.maximum, np.minimum, np.bitwise_and, np.bitwise_or, np.bitwise_xor)


def loop_reduce(x, op, loop_indices, dtype=None, mask=None, name=None):
    """``b = nl.loop_reduce(x, op, loop_indices)``: ``b = op(b, x)`` on the Vector Engine.

    The destination (what the assignment target, a name or a subscript such as
    ``z[m, :, n0:n1]``, holds before the call, e.g. from ``nl.zeros``) is also an
    operand, as in NKI; the simulator reads it from the assignment the call is the value
    of. ``loop_indices`` names the loops reduced over (a hint to the compiler; results
    do not depend on it).
    """
    instr = "nl.loop_reduce"
    idx = loop_indices if isinstance(loop_indices, (tuple, list)) else (loop_indices,)
    for i in idx:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{instr}: loop_indices must be loop indices (ints), got {type(i).__name__}")
    fn = getattr(op, "reduce_ufunc", None) or _NUMPY_REDUCTIONS.get(op) or _op_fn(op, instr)
    if fn not in _COMMUTATIVE:
        raise NotImplementedError(
            f"{instr}: op {op!r}: NKI documents the destination as the right-hand operand but "
            f"its equivalent code as the left one, so only commutative operators (add, "
            f"multiply, maximum, minimum, bitwise and/or/xor) have a defined result"
        )
    target, frame = _callsite.assignment_target((__name__, _kwcheck.__name__))
    if target is None:
        raise NotImplementedError(
            f"{instr}: the simulator finds the destination from the assignment the call is "
            f"the value of; write `b = nl.loop_reduce(x, op, loop_indices)` (or "
            f"`b[...] = ...`) with a single name or subscript as the target"
        )
    try:
        acc = eval(target, frame.f_globals, frame.f_locals)  # noqa: S307 (the kernel's own target expression)
    except NameError:
        acc = None
    if not isinstance(acc, NkiTensor):
        raise TypeError(
            f"{instr}: destination '{target}' must hold the accumulator tile before the loop "
            f"(e.g. {target} = nl.zeros(shape, dtype=nl.float32, buffer=nl.sbuf)), got "
            f"{type(acc).__name__}"
        )
    return _ops.elementwise(instr, "Vector", fn, [acc, x], dtype, mask, names=[target, "x"])


# ----- collectives and atomics ------------------------------------------------------------------
def all_reduce(*args, **kwargs):
    """Not simulated: a kernel launch here runs on one NeuronCore, with no peers."""
    raise NotImplementedError(
        "nl.all_reduce: collective communication between NeuronCores "
        "is not simulated (a simulated kernel runs on one NeuronCore); "
        "use torch.distributed with the 'neuron' backend instead"
    )


def atomic_rmw(dst, value, op, mask=None):
    """``dst = op(dst, value)`` on an HBM tensor view, read-modify-write (DMA)."""
    instr = "nl.atomic_rmw"
    if not isinstance(dst, NkiTensor) or dst.buffer not in _HBM:
        _fail(NKIBufferError, instr, "dst", "must be an HBM tensor (view)")
    fn = _op_fn(op, instr)
    v, _, _ = _ops.operand(value, instr, "value", mask, allowed=("sbuf",))
    old = dst._read(instr, "dst", mask).astype(np.float32)
    dst._write(instr, "dst", fn(old, _ops.align(v, dst.shape)), mask)
    _ops.charge_dma(instr, 2 * int(np.prod(dst.shape)) * dst.itemsize)


def _op_fn(op, instr, operand="op"):
    if isinstance(op, Op):
        return op.fn
    if isinstance(op, np.ufunc) or callable(op):
        return op
    raise TypeError(f"{instr}: operand '{operand}': unsupported op {op!r}")


def static_cast(x, dtype):
    """``x`` converted to ``dtype``: a tile (a Vector copy) or a host NumPy array."""
    if isinstance(x, NkiTensor):
        return copy(x, dtype=dtype)  # noqa: F821 (nl.copy: defined from _math.UNARY below)
    d = _dt.as_dtype(dtype)
    if d.is_float and d is not float32 and d is not float16:
        # bf16 / FP8: the ml_dtypes array type (rounded to nearest even, as the engines do)
        return np.asarray(x).astype(d.dtype)
    return np.asarray(x).astype(d.np_storage if not d.is_float else (np.float16 if d is float16 else np.float32))


# ----- misc -------------------------------------------------------------------------------------
def device_print(prefix, x):
    """Print a tile's values from inside the kernel (simulator only)."""
    vals = x._read("nl.device_print", "x") if isinstance(x, NkiTensor) else x
    print(prefix, vals)


def static_assert(cond, msg=""):
    if not cond:
        raise AssertionError(msg)


_kwcheck.install(globals(), "nl", open_ended=("all_reduce",))
