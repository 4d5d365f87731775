"""Engine primitives shared by ``nki.language`` and ``nki.isa``: the tile type with its
operators, operand reading, result allocation, elementwise/reduction/matmul execution
and cost charging. Math runs in fp32 on host (as the engines do) and results are
rounded to the output dtype on write.

Module graph (no cycles): _errors, _dtypes, _math <- _rules, _cost_model <-
_context <- _tensor <- _ops <- language <- isa; _simulator and _jit sit on top.
"""

import sys

import numpy as np

from . import _cost_model as cm
from . import _dtypes as dt
from . import _kwcheck, _math
from . import _rules as rules
from ._context import current_run
from ._errors import NKIBufferError, NKIContextError, NKIDtypeError, NKIShapeError, NKITileSizeError, _fail
from ._tensor import ON_CHIP, TensorView, align, make_storage, par_dim
from .compiler import Allocation

HBM = ("hbm", "shared_hbm", "private_hbm")
_counter = [0]


def _name(prefix):
    _counter[0] += 1
    return f"{prefix}_{_counter[0]}"


class _RefProbe:
    def __setitem__(self, key, value):
        _RefProbe.temp_refs = sys.getrefcount(value)


_RefProbe()[0] = object()  # references a temporary has inside __setitem__ (CPython)


class NkiTensor(TensorView):
    """A tensor or tile in HBM, SBUF or PSUM; operators run NKI elementwise instructions."""

    def __setitem__(self, key, value):
        # `t[...] = <instruction result>`: the instruction writes t directly (no copy
        # instruction), as NKI compiles it; assigning a named tile is a Vector copy.
        fresh = isinstance(value, TensorView) and sys.getrefcount(value) <= _RefProbe.temp_refs
        target = self[key]
        if (
            isinstance(value, TensorView)
            and value._storage is target._storage
            and value._adv is None
            and target._adv is None
            and value._view.__array_interface__ == target._view.__array_interface__
        ):
            return  # `t[k] += x` already wrote in place through __iadd__
        if target.buffer not in ON_CHIP:
            _fail(
                NKIBufferError,
                "tensor assignment",
                target.name,
                f"cannot assign into a {target.buffer.upper()} tensor from a kernel "
                f"expression; use nl.store(dst, value) or nisa.dma_copy",
            )
        assign(target, value, charge=not fresh)

    def broadcast_to(self, shape):
        """This tile broadcast to ``shape`` (partition-aligned), as a Vector copy."""
        return broadcast_to(self, shape)

    def _binop(name, reverse=False):
        fn = _math.BINARY[name]

        def op(self, other):
            args = [other, self] if reverse else [self, other]
            return elementwise(f"nl.{name}", "Vector", fn, args)

        return op

    __add__ = _binop("add")
    __radd__ = _binop("add", True)
    __sub__ = _binop("subtract")
    __rsub__ = _binop("subtract", True)
    __mul__ = _binop("multiply")
    __rmul__ = _binop("multiply", True)
    __truediv__ = _binop("divide")
    __rtruediv__ = _binop("divide", True)
    __pow__ = _binop("power")
    __rpow__ = _binop("power", True)
    __mod__ = _binop("mod")
    __lt__ = _binop("less")
    __le__ = _binop("less_equal")
    __gt__ = _binop("greater")
    __ge__ = _binop("greater_equal")
    __and__ = _binop("logical_and")
    __or__ = _binop("logical_or")
    __xor__ = _binop("logical_xor")
    __eq__ = _binop("equal")
    __ne__ = _binop("not_equal")
    del _binop
    __hash__ = object.__hash__

    def __matmul__(self, other):
        return matmul_nt("nl.matmul", self, other)

    def __neg__(self):
        return elementwise("nl.negative", "Vector", np.negative, [self])

    def __abs__(self):
        return elementwise("nl.abs", "Vector", np.abs, [self])

    def _inplace(name):
        fn = _math.BINARY[name]

        def op(self, other):
            if name == "add" and self.buffer == "psum" and isinstance(other, TensorView) and other.buffer == "psum":
                # PSUM accumulation happens as the Tensor Engine writes: no engine time
                vals = other._read("psum accumulate", "value")
                if self._initialised().all():
                    vals = self._read("psum accumulate", "dst").astype(np.float32) + vals
                self._write("psum accumulate", "dst", vals)
                return self
            result = elementwise(f"nl.{name}", "Vector", fn, [self, other])
            assign(self, result, instr=f"nl.{name} (in place)", charge=False)
            return self

        return op

    __iadd__ = _inplace("add")
    __isub__ = _inplace("subtract")
    __imul__ = _inplace("multiply")
    __itruediv__ = _inplace("divide")
    del _inplace


# ----- allocation -----------------------------------------------------------------
def new_storage(shape, dtype, buffer, name, initialised=False):
    """Allocate a tensor (accounted by the running kernel when on-chip)."""
    placement = None
    if isinstance(buffer, Allocation):
        placement, buffer = buffer, buffer.buffer
    if buffer not in ("hbm", "shared_hbm", "private_hbm", "sbuf", "psum"):
        raise ValueError(f"unknown buffer {buffer!r}; expected nl.hbm/nl.shared_hbm/" f"nl.private_hbm/nl.sbuf/nl.psum")
    dtype = dt.as_dtype(dtype) or dt.float32
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    pdim = 0
    for i, s in enumerate(shape):
        if isinstance(s, par_dim):
            pdim = i
    shape = tuple(int(s) for s in shape)
    st = make_storage(shape, dtype, buffer, name, initialised)
    st.pdim = pdim
    run = current_run(required=False)
    if run is not None and buffer in ON_CHIP:
        run.allocate(st, shape, dtype, pdim, placement)
    elif placement is not None:
        raise NKIContextError(f"direct allocation of '{name}' needs a running kernel")
    return NkiTensor(st, st.data, pdim if buffer in ON_CHIP else None, init=st.init)


def from_array(array, dtype, buffer, name):
    """Wrap an existing host array (a kernel argument) as an initialised HBM tensor."""
    st = make_storage((), dtype, buffer, name, True)
    st.data = array
    return NkiTensor(st, array, None)


def new_tile(values, dtype, instr, buffer="sbuf", name=None, shape=None):
    """Allocate a result tile holding ``values`` rounded to ``dtype``."""
    run = current_run()
    shape = tuple(np.shape(values)) if shape is None else tuple(shape)
    rules.check_partition(run.hw, instr, "result", shape)
    if buffer == "psum":
        rules.check_psum_tile(run.hw, instr, "result", shape, dtype)
    t = new_storage(shape, dtype, buffer, name or _name(instr.split(".")[-1]))
    if values is not None:
        t._write(instr, "result", values)
    return t


# ----- operands -------------------------------------------------------------------------
def operand(x, instr, name, mask=None, allowed=ON_CHIP):
    """Read an instruction operand: (fp32-or-int array, dtype or None, tensor or None)."""
    if isinstance(x, TensorView):
        rules.check_on_chip(instr, name, x, allowed)
        if x._pdim not in (0, None) and x.buffer in ON_CHIP:
            _fail(
                NKIShapeError,
                instr,
                name,
                f"tile view still has {x._pdim} block dimension(s) before the partition "
                f"dimension (shape {x.shape}); index one tile, e.g. t[i]",
            )
        if x.buffer in ON_CHIP:
            rules.check_partition(current_run().hw, instr, name, x.shape)
        return x._read(instr, name, mask), x.dtype, x
    if isinstance(x, (int, float, bool, np.number, np.ndarray)):
        a = np.asarray(x)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        return a, None, None
    raise TypeError(f"{instr}: operand '{name}': unsupported value {type(x).__name__}")


def _f32(a):
    return a.astype(np.float32) if a.dtype.kind == "f" else a


def broadcast_operands(instr, arrays, names, is_tile):
    """NKI broadcasting: tiles align at the partition axis ([P] acts as [P, 1])."""
    nd = max([a.ndim for a in arrays] or [0])
    out = []
    for a, tile in zip(arrays, is_tile):
        if tile and 0 < a.ndim < nd:
            a = a.reshape(a.shape + (1,) * (nd - a.ndim))
        out.append(a)
    try:
        shape = np.broadcast_shapes(*[a.shape for a in out])
    except ValueError:
        _fail(
            NKIShapeError,
            instr,
            names[-1],
            f"shapes {[tuple(a.shape) for a in arrays]} do not broadcast (tiles align at "
            f"the partition axis; free axes broadcast from size 1)",
        )
    return out, shape


# ----- cost charging ---------------------------------------------------------------------
def _is16(d):
    return d is dt.bfloat16 or d is dt.float16


def charge_elementwise(engine, instr, shape, n_inputs=1, dtypes=()):
    run = current_run()
    p = shape[0] if len(shape) else 1
    free = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    all16 = bool(dtypes) and all(_is16(d) for d in dtypes)
    run.ledger.charge(engine, instr, cm.elementwise_seconds(run.hw, engine, p, free, n_inputs, all16))


def charge_dma(instr, nbytes):
    run = current_run()
    run.ledger.charge("DMA", instr, cm.dma_seconds(run.hw, nbytes), hbm_bytes=nbytes)


# ----- results --------------------------------------------------------------------------
def finish(result, dst, instr, accumulate=False, mask=None):
    """Return ``result`` or, with a ``dst``, write it there (and return ``dst``)."""
    if dst is None:
        return result
    if not isinstance(dst, TensorView):
        raise TypeError(f"{instr}: operand 'dst' must be a tile, got {type(dst).__name__}")
    rules.check_on_chip(instr, "dst", dst)
    vals = result._read(instr, "result") if isinstance(result, TensorView) else result
    if isinstance(result, TensorView) and result.buffer == "psum":
        current_run().release_transient(result._storage)
    if accumulate:
        vals = dst._read(instr, "dst", mask).astype(np.float32) + align(vals, dst.shape)
    dst._write(instr, "dst", vals, mask)
    return dst


def elementwise(instr, engine, fn, operands, dtype=None, mask=None, dst=None, names=None):
    """Run ``fn`` on operand arrays; allocate an SBUF result of the promoted dtype."""
    names = names or [f"x{i}" if len(operands) > 1 else "x" for i in range(len(operands))]
    arrays, dtypes, is_tile = [], [], []
    for x, n in zip(operands, names):
        a, d, t = operand(x, instr, n, mask)
        arrays.append(_f32(a))
        dtypes.append(d)
        is_tile.append(t is not None)
    arrays, shape = broadcast_operands(instr, arrays, names, is_tile)
    with np.errstate(all="ignore"):
        values = np.asarray(fn(*arrays))
    shape = np.broadcast_shapes(shape, values.shape)
    out_dtype = dt.as_dtype(dtype) or (dst.dtype if dst is not None else dt.promote(*dtypes))
    tiles = [d for d in dtypes if d is not None]
    charge_elementwise(engine, instr, shape, n_inputs=len(tiles), dtypes=tiles + [out_dtype])
    if dst is not None:
        return finish(np.broadcast_to(values, shape), dst, instr, mask=mask)
    if mask is not None:
        values = np.where(np.broadcast_to(mask, shape), values, 0)
    return new_tile(np.broadcast_to(values, shape), out_dtype, instr)


def broadcast_to(x, shape):
    """Broadcast a tile to ``shape`` along size-1 axes (partition-aligned; Vector copy)."""
    shape = tuple(int(s) for s in shape)
    return elementwise("nl.broadcast_to", "Vector", lambda a: align(a, shape), [x])


def assign(target, value, instr="tensor_copy", charge=True):
    """``tile[...] = value`` inside a kernel: an on-chip copy (Vector Engine) unless free."""
    if isinstance(value, TensorView):
        vals, _, _ = operand(value, instr, "value")
    else:
        vals = np.asarray(value)
    if charge:
        charge_elementwise("Vector", instr, target.shape, dtypes=[target.dtype])
    target._write(instr, "dst", vals)


def reduce(instr, ufunc, x, axis, dtype=None, keepdims=False, mask=None, negate=False, engine="Vector"):
    """Reduce tile ``x`` along free ``axis``; all free axes reduced gives a [P, 1] tile."""
    a, d, _ = operand(x, instr, "x" if instr.startswith("nl.") else "data", mask)
    if a.ndim < 2:
        a = a.reshape(a.shape + (1,) * (2 - a.ndim))
    rules.check_free_axes(instr, "x", axis, a.ndim)
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    axes = tuple(sorted({ax + a.ndim if ax < 0 else ax for ax in axes}))
    x32 = _f32(a)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask, bool), x32.shape)
        ident = _identity(ufunc, x32.dtype)
        x32 = np.where(m, x32, ident)
    with np.errstate(all="ignore"):
        vals = ufunc.reduce(x32, axis=axes, keepdims=True)
    if negate:
        vals = -vals
    if not keepdims:
        keep = [s for i, s in enumerate(vals.shape) if i not in axes]
        vals = vals.reshape(keep if len(keep) > 1 else (a.shape[0], 1))
    charge_elementwise(engine, instr, a.shape, dtypes=[d])
    return vals, d


def _identity(ufunc, npdtype):
    if (
        ufunc is np.add
        or ufunc is np.logical_or
        or ufunc is np.bitwise_or
        or ufunc is np.bitwise_xor
        or ufunc is np.logical_xor
    ):
        return 0
    if ufunc is np.multiply or ufunc is np.logical_and:
        return 1
    if ufunc is np.maximum:
        return -np.inf if npdtype.kind == "f" else np.iinfo(npdtype).min
    if ufunc is np.minimum:
        return np.inf if npdtype.kind == "f" else np.iinfo(npdtype).max
    if ufunc is np.bitwise_and:
        return -1
    raise ValueError(f"no identity for {ufunc}")


# ----- Tensor Engine ------------------------------------------------------------------
def matmul(instr, stationary, moving, name_st="stationary", name_mv="moving"):
    """``stationary.T @ moving`` on the Tensor Engine into a new fp32 PSUM tile."""
    run = current_run()
    for t, n in ((stationary, name_st), (moving, name_mv)):
        if not isinstance(t, TensorView):
            raise TypeError(f"{instr}: operand '{n}' must be a tile")
        if t.buffer != "sbuf":
            _fail(NKIBufferError, instr, n, f"tile in {t.buffer.upper()}; the Tensor Engine reads SBUF only")
    rules.check_matmul(
        run.hw, instr, stationary.shape, moving.shape, stationary.dtype, moving.dtype, names=(name_st, name_mv)
    )
    a, _, _ = operand(stationary, instr, name_st)
    b, _, _ = operand(moving, instr, name_mv)
    vals = a.astype(np.float32).T @ b.astype(np.float32)
    fp32 = dt.float32 in (stationary.dtype, moving.dtype)
    k, m = stationary.shape
    n = moving.shape[1]
    run.ledger.charge(
        "Tensor", instr, cm.matmul_seconds(run.hw, n, "float32" if fp32 else moving.dtype.name), flops=2.0 * k * m * n
    )
    return new_tile(vals, dt.float32, instr, buffer="psum")


def matmul_double_row(instr, stationary, moving):
    """FP8 double-row mode (``perf_mode=double_row``): stationary [K, 2, M] and moving
    [K, 2, N] pack two FP8 rows per partition, so one pass contracts over 2K rows at the
    single-row rate: ``einsum("kli,klj->ij")`` into a new fp32 PSUM tile [M, N]."""
    run = current_run()
    shapes = []
    for t, n in ((stationary, "stationary"), (moving, "moving")):
        if not isinstance(t, TensorView):
            raise TypeError(f"{instr}: operand '{n}' must be a tile")
        if t.buffer != "sbuf":
            _fail(NKIBufferError, instr, n, f"tile in {t.buffer.upper()}; the Tensor Engine reads SBUF only")
        if t.ndim != 3 or t.shape[1] != 2:
            _fail(NKIShapeError, instr, n, f"double_row mode needs a [K, 2, free] tile, got shape {t.shape}")
        if t.dtype not in (dt.float8_e4m3, dt.float8_e5m2):
            _fail(NKIDtypeError, instr, n, f"double_row is an FP8 mode (float8_e4m3/e5m2), got {t.dtype!r}")
        shapes.append((t.shape[0], t.shape[2]))
    (k, m), (k2, n) = shapes
    rules.check_matmul(run.hw, instr, (k, m), (k2, n), stationary.dtype, moving.dtype, names=("stationary", "moving"))
    a, _, _ = operand(stationary, instr, "stationary")
    b, _, _ = operand(moving, instr, "moving")
    vals = np.einsum("kli,klj->ij", a.astype(np.float32), b.astype(np.float32))
    run.ledger.charge("Tensor", instr, cm.matmul_seconds(run.hw, n, moving.dtype.name), flops=2.0 * 2 * k * m * n)
    return new_tile(vals, dt.float32, instr, buffer="psum")


def transpose_pe(instr, x, name):
    """Partition <-> free transpose of a [P, F<=128] SBUF tile on the Tensor Engine
    (a matmul against the identity), into a PSUM tile of the input's dtype."""
    run = current_run()
    if not isinstance(x, TensorView) or x.ndim != 2:
        _fail(NKIShapeError, instr, name, "transpose needs a 2-D tile")
    if x.buffer != "sbuf":
        _fail(NKIBufferError, instr, name, f"tile in {x.buffer.upper()}; the Tensor Engine reads SBUF only")
    p, f = x.shape
    rules.check_partition(run.hw, instr, name, x.shape)
    if f > run.hw.pmax:
        _fail(
            NKITileSizeError,
            instr,
            name,
            f"free size {f} exceeds {run.hw.pmax}: it becomes the partition dimension of "
            f"the transposed tile (nl.tile_size.pmax)",
        )
    a, _, _ = operand(x, instr, name)
    run.ledger.charge("Tensor", instr, cm.matmul_seconds(run.hw, p, x.dtype.name))
    return new_tile(a.T, x.dtype, instr, buffer="psum")


def matmul_nt(instr, x, y, transpose_x=False):
    """``x @ y`` (nl.matmul): the compiler inserts a PE transpose of ``x`` unless
    ``transpose_x`` says it is already [K, M]."""
    if not isinstance(x, TensorView) or not isinstance(y, TensorView):
        raise TypeError(f"{instr}: operands must be tiles")
    # nl.matmul is a language-level op: the compiler copies PSUM operands to SBUF first
    # (nisa.nc_matmul itself rejects them)
    x, y = (_to_sbuf(instr, t) for t in (x, y))
    if transpose_x:
        return matmul(instr, x, y, name_st="x", name_mv="y")
    if x.ndim != 2:
        _fail(NKIShapeError, instr, "x", f"must be a 2-D tile, got shape {x.shape}")
    xt = transpose_pe(instr, x, "x")
    xs = new_tile(xt._view, x.dtype, instr)
    del xt
    return matmul(instr, xs, y, name_st="x", name_mv="y")


def _to_sbuf(instr, t):
    if t.buffer != "psum":
        return t
    vals, d, _ = operand(t, instr, "x")
    charge_elementwise("Vector", f"{instr} (PSUM -> SBUF copy)", t.shape, dtypes=[d])
    return new_tile(vals, d, instr)


class Op:
    """An elementwise function that is also usable as an ``op=`` of nki.isa calls."""

    def __init__(self, name, fn, engine, arity):
        self.__name__ = self.name = name
        self.fn = fn
        self.engine = engine
        self.arity = arity
        self.reduce_ufunc = _math.REDUCE_UFUNC.get(name)
        self.__doc__ = f"nl.{name}: elementwise, executed on the {engine} Engine."

    def __call__(self, *args, **kwargs):
        for key in kwargs:
            if key not in ("dtype", "mask"):
                raise _kwcheck.unexpected_keyword(f"nl.{self.name}", key, ("dtype", "mask"))
        dtype, mask = kwargs.get("dtype"), kwargs.get("mask")
        if len(args) != self.arity:
            raise TypeError(f"nl.{self.name} takes {self.arity} tile argument(s)")
        return elementwise(f"nl.{self.name}", self.engine, self.fn, list(args), dtype, mask)

    def __repr__(self):
        return f"nl.{self.name}"
