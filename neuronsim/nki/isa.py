"""``nki.isa`` (``nisa``): direct NeuronCore instructions on the simulated core.

Names and arguments follow AWS's public ``nki.isa`` reference. Every instruction with
a ``dst`` takes it first, positionally or as ``dst=`` (the current API); the older
form without ``dst`` returns a new tile. Each instruction checks the hardware rules,
runs exactly on host in fp32 and charges its engine.
"""

import enum
import functools

import numpy as np

from . import _cost_model as cm
from . import _dtypes as dt
from . import _kwcheck, _math, _ops
from . import _rules as rules
from . import language as nl
from ._context import current_run
from ._errors import NKIBufferError, NKIDtypeError, NKIShapeError, NKITileSizeError, _fail
from ._ops import NkiTensor


class engine(enum.Enum):
    """Engine selector of instructions that can run on several engines."""

    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    activation = 3
    pe = 1
    dma = 5
    sync = 6


_Engine = engine  # instructions' `engine=` parameter shadows the class

# module-level names the API documents
tensor_engine, vector_engine, scalar_engine, gpsimd_engine = (
    engine.tensor,
    engine.vector,
    engine.scalar,
    engine.gpsimd,
)
_ENGINE_NAME = {engine.tensor: "Tensor", engine.vector: "Vector", engine.scalar: "Scalar", engine.gpsimd: "GpSimd"}


class reduce_cmd(enum.Enum):
    """State of the Vector/Scalar engine accumulator registers."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    none = 0
    double_row = 1


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version():
    """NeuronCore generation of the simulated target (trn2 -> gen3, trn3 -> gen4)."""
    return nc_version.gen3 if current_run().hw.name == "trn2" else nc_version.gen4


# ----- argument helpers -------------------------------------------------------------------
def _dst_first(n_lead):
    """Accept ``f(dst, *old_args)`` as well as ``f(*old_args, dst=...)``.

    ``n_lead`` is how many leading tile arguments the dst-less form takes; a call
    passing one more leading tile passes ``dst`` first.
    """

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            if "dst" not in kwargs and args:
                lead = 0
                for a in args:
                    if not isinstance(a, NkiTensor):
                        break
                    lead += 1
                if lead > n_lead:
                    kwargs["dst"] = args[0]
                    args = args[1:]
            return f(*args, **kwargs)

        return wrapper

    return deco


def _op_fn(op, instr, operand="op"):
    """Accept nl ops (nl.add, nl.exp, ...) and NumPy ufuncs (np.add, ...)."""
    if isinstance(op, _ops.Op):
        return op.fn
    if isinstance(op, np.ufunc) or callable(op):
        return op
    raise TypeError(f"{instr}: operand '{operand}': unsupported op {op!r}")


def _reduce_ufunc(op, instr, operand="op"):
    """Reduction operator as a NumPy ufunc: nl.add/np.add, nl.maximum, nl.sum, nl.max, ..."""
    u = getattr(op, "reduce_ufunc", None)
    if u is not None:
        return u
    if isinstance(op, np.ufunc):
        return op
    for k, v in ((np.sum, np.add), (np.max, np.maximum), (np.min, np.minimum), (np.prod, np.multiply)):
        if op is k:
            return v
    _fail(NKIShapeError, instr, operand, f"{op!r} is not a reduction operator")


def _engine(eng, default):
    return _ENGINE_NAME.get(eng, default) if eng is not None else default


def _scalar_operand(x, instr, name, p, ndim):
    """A scalar or a per-partition [P, 1] tile, shaped to broadcast along free axes."""
    if isinstance(x, NkiTensor):
        a, _, _ = _ops.operand(x, instr, name)
        if a.ndim < 1 or a.shape[0] not in (1, p) or int(np.prod(a.shape[1:])) != 1:
            _fail(NKIShapeError, instr, name, f"must be a scalar or a [{p}, 1] per-partition tile, got shape {a.shape}")
        return a.reshape((a.shape[0],) + (1,) * (ndim - 1)).astype(np.float32)
    return np.float32(x)


def _write_or_new(vals, dtype, dst, instr, mask=None, buffer="sbuf"):
    if dst is not None:
        return _ops.finish(vals, dst, instr, mask=mask)
    return _ops.new_tile(vals, dtype, instr, buffer=buffer)


class _Accumulator:
    """The Vector/Scalar engines' accumulator registers (one value per partition)."""

    def update(self, engine_name, cmd, op_ufunc, partial, init=None):
        run = current_run()
        regs = run.__dict__.setdefault("_acc", {})
        if cmd in (reduce_cmd.reset_reduce, reduce_cmd.idle, None):
            acc = partial
        elif cmd is reduce_cmd.reduce:
            prev = regs.get(engine_name)
            acc = partial if prev is None or prev.shape != partial.shape else op_ufunc(prev, partial)
        elif cmd is reduce_cmd.load_reduce:
            acc = op_ufunc(np.broadcast_to(np.asarray(init, np.float32), partial.shape), partial)
        elif cmd is reduce_cmd.reset:
            acc = None
        else:
            raise ValueError(f"unknown reduce_cmd {cmd!r}")
        regs[engine_name] = acc
        return acc


_ACC = _Accumulator()


def _reduce_into(instr, engine_name, res_vals, reduce_op, reduce_res, cmd, init=None, negate=False):
    red = _reduce_ufunc(reduce_op, instr, "reduce_op")
    flat = res_vals.reshape(res_vals.shape[0], -1).astype(np.float32)
    partial = red.reduce(flat, axis=1, keepdims=True)
    acc = _ACC.update(engine_name, cmd, red, partial, init)
    if reduce_res is not None and acc is not None:
        reduce_res._write(instr, "reduce_res", -acc if negate else acc)


# ----- Tensor Engine -------------------------------------------------------------------------
@_dst_first(2)
def nc_matmul(
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    mask=None,
    dst=None,
    accumulate=None,
    tile_position=(),
    tile_size=(),
    perf_mode=None,
    name=None,
):
    """``stationary.T @ moving`` on the Tensor Engine (stationary [K, M], moving [K, N]).

    Returns a new PSUM fp32 tile [M, N], or writes ``dst``: ``accumulate=False``
    overwrites, ``True`` adds to it, ``None`` overwrites the first time and adds after.
    ``is_transpose=True`` is the bit-accurate transpose mode: ``moving`` must be the
    identity, and ``dst`` receives ``stationary.T`` exactly (in its own dtype).
    """
    instr = "nisa.nc_matmul"
    if dst is not None and dst.buffer != "psum":
        _fail(NKIBufferError, instr, "dst", f"tile in {dst.buffer.upper()}; nc_matmul " f"writes PSUM only")
    if is_transpose:
        return _pe_transpose_mode(instr, stationary, moving, dst)
    if perf_mode in (matmul_perf_mode.double_row, "double_row", "double_row_gen3"):
        res = _ops.matmul_double_row(instr, stationary, moving)
    else:
        res = _ops.matmul(instr, stationary, moving)
    if dst is None:
        return res
    rules.check_psum_dtype(current_run().hw, instr, "dst", dst.dtype)
    if accumulate is None:
        accumulate = bool(dst._initialised().all())
    return _ops.finish(res, dst, instr, accumulate=bool(accumulate))


def _pe_transpose_mode(instr, stationary, moving, dst):
    run = current_run()
    m, _, _ = _ops.operand(moving, instr, "moving")
    k = stationary.shape[0]
    if m.shape != (k, k) or not np.array_equal(m, np.eye(k, dtype=m.dtype)):
        _fail(
            NKIShapeError,
            instr,
            "moving",
            f"is_transpose=True needs the [{k}, {k}] identity as moving (got shape "
            f"{m.shape}{'' if m.shape != (k, k) else ', not the identity'}); use "
            f"nl.shared_identity_matrix({k})",
        )
    rules.check_matmul(run.hw, instr, stationary.shape, moving.shape, stationary.dtype, moving.dtype)
    a, d, _ = _ops.operand(stationary, instr, "stationary")
    run.ledger.charge("Tensor", instr, cm.matmul_seconds(run.hw, k, stationary.dtype.name))
    if dst is None:
        return _ops.new_tile(a.T, d, instr, buffer="psum")
    dst._write(instr, "dst", a.T)
    return dst


@_dst_first(1)
def nc_transpose(data, engine=engine.unknown, dst=None, name=None):
    """Partition <-> free transpose: Tensor Engine (<=128x128, to PSUM) or Vector (<=32x32)."""
    instr = "nisa.nc_transpose"
    vector = engine is globals()["engine"].vector or (
        engine is globals()["engine"].unknown and dst is not None and dst.buffer == "sbuf"
    )
    if vector:
        a, d, _ = _ops.operand(data, instr, "data")
        if a.ndim != 2 or a.shape[0] > 32 or a.shape[1] > 32:
            _fail(NKITileSizeError, instr, "data", f"Vector Engine transpose supports tiles up to 32x32, got {a.shape}")
        _ops.charge_elementwise("Vector", instr, a.shape, dtypes=[d])
        res = _ops.new_tile(a.T, d, instr)
    else:
        res = _ops.transpose_pe(instr, data, "data")
    return _ops.finish(res, dst, instr)


# ----- Scalar Engine -------------------------------------------------------------------------
@_dst_first(0)
def activation(
    op,
    data,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=None,
    dtype=None,
    mask=None,
    dst=None,
    engine=None,
    name=None,
):
    """``op(data * scale + bias)`` on the Scalar Engine, with optional free-axis reduction
    of the result into ``reduce_res`` ([P, 1])."""
    instr = "nisa.activation"
    fn = _op_fn(op, instr)
    a, d, _ = _ops.operand(data, instr, "data", mask)
    p = a.shape[0]
    x = a.astype(np.float32) * _scalar_operand(scale, instr, "scale", p, a.ndim)
    if bias is not None:
        x = x + _scalar_operand(bias, instr, "bias", p, a.ndim)
    with np.errstate(all="ignore"):
        vals = np.asarray(fn(x), np.float32)
    _ops.charge_elementwise("Scalar", instr, a.shape)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    rounded = dt.round_to(vals, out_d)
    if reduce_op is not None or reduce_res is not None:
        if reduce_res is None:
            _fail(NKIShapeError, instr, "reduce_res", "reduce_op needs a reduce_res tile")
        _reduce_into(instr, "Scalar", rounded, reduce_op or np.add, reduce_res, reduce_cmd)
    return _write_or_new(rounded, out_d, dst, instr, mask)


@_dst_first(0)
def activation_reduce(
    op, data, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None, dst=None, name=None
):
    """:func:`activation` plus a free-axis reduction of its result into ``reduce_res``."""
    return activation(
        op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, dtype=dtype, mask=mask, dst=dst
    )


# ----- Vector / GpSimd ------------------------------------------------------------------------
@_dst_first(2)
def tensor_tensor(data1, data2, op, engine=engine.unknown, dtype=None, mask=None, dst=None, name=None):
    """Elementwise ``op(data1, data2)`` of two same-shape tiles (Vector or GpSimd)."""
    instr = "nisa.tensor_tensor"
    if isinstance(data1, NkiTensor) and isinstance(data2, NkiTensor):
        if data1.buffer == "psum" and data2.buffer == "psum":
            _fail(
                NKIBufferError, instr, "data2", "both operands in PSUM; the engines read at most one operand from PSUM"
            )
        if int(np.prod(data1.shape)) != int(np.prod(data2.shape)) or data1.shape[0] != data2.shape[0]:
            _fail(NKIShapeError, instr, "data2", f"shape {data2.shape} differs from data1 shape {data1.shape}")
    return _ops.elementwise(
        instr, _engine(engine, "Vector"), _op_fn(op, instr), [data1, data2], dtype, mask, dst, names=["data1", "data2"]
    )


@_dst_first(1)
def tensor_scalar(
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    engine=engine.unknown,
    dtype=None,
    mask=None,
    dst=None,
    name=None,
):
    """``(data op0 operand0) op1 operand1`` with scalar / [P, 1] operands."""
    instr = "nisa.tensor_scalar"
    x = _tensor_scalar_vals(instr, data, op0, operand0, reverse0, op1, operand1, reverse1, mask)
    a_shape, d = data.shape, data.dtype
    _ops.charge_elementwise(_engine(engine, "Vector"), instr, a_shape, dtypes=[d])
    return _write_or_new(x, dt.as_dtype(dtype) or (dst.dtype if dst is not None else d), dst, instr, mask)


def _tensor_scalar_vals(instr, data, op0, operand0, reverse0, op1, operand1, reverse1, mask):
    a, _, _ = _ops.operand(data, instr, "data", mask)
    p = a.shape[0]

    def apply(x, op, operand, reverse, name):
        v = _scalar_operand(operand, instr, name, p, x.ndim)
        f = _op_fn(op, instr, name.replace("operand", "op"))
        return f(v, x) if reverse else f(x, v)

    with np.errstate(all="ignore"):
        x = apply(a.astype(np.float32), op0, operand0, reverse0, "operand0")
        if op1 is not None:
            x = apply(x, op1, operand1, reverse1, "operand1")
    return np.asarray(x)


@_dst_first(1)
def tensor_scalar_reduce(
    data,
    op0,
    operand0,
    reduce_op,
    reduce_res=None,
    reverse0=False,
    reduce_cmd=reduce_cmd.reset_reduce,
    reduce_init=None,
    reduce_res_negate=False,
    dtype=None,
    mask=None,
    dst=None,
    name=None,
):
    """:func:`tensor_scalar` with one operator, plus a reduction of the result over all
    free axes into ``reduce_res`` ([P, 1]) (Vector Engine)."""
    instr = "nisa.tensor_scalar_reduce"
    x = _tensor_scalar_vals(instr, data, op0, operand0, reverse0, None, None, False, mask)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else data.dtype)
    _ops.charge_elementwise("Vector", instr, data.shape, dtypes=[data.dtype])
    init = None
    if reduce_init is not None:
        init = _scalar_operand(reduce_init, instr, "reduce_init", x.shape[0], 2)
    _reduce_into(instr, "Vector", x, reduce_op, reduce_res, reduce_cmd, init, negate=reduce_res_negate)
    return _write_or_new(x, out_d, dst, instr, mask)


@_dst_first(1)
def scalar_tensor_tensor(
    data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None, mask=None, dst=None, name=None
):
    """``(data op0 operand0) op1 operand1``: operand0 scalar/[P,1], operand1 a tile."""
    instr = "nisa.scalar_tensor_tensor"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    v = _scalar_operand(operand0, instr, "operand0", a.shape[0], a.ndim)
    b, d2, _ = _ops.operand(operand1, instr, "operand1", mask)
    f0, f1 = _op_fn(op0, instr, "op0"), _op_fn(op1, instr, "op1")
    with np.errstate(all="ignore"):
        x = f0(v, a.astype(np.float32)) if reverse0 else f0(a.astype(np.float32), v)
        x = f1(b.astype(np.float32), x) if reverse1 else f1(x, b.astype(np.float32))
    _ops.charge_elementwise("Vector", instr, a.shape, n_inputs=2, dtypes=[d, d2])
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else dt.promote(d, d2))
    return _write_or_new(x, out_d, dst, instr, mask)


@_dst_first(2)
def tensor_tensor_scan(
    data0, data1, initial, op0, op1, reverse0=False, reverse1=False, dtype=None, mask=None, dst=None, name=None
):
    """Per partition: ``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` with
    ``r[:, -1] = initial`` (scalar or [P, 1]) (Vector Engine)."""
    instr = "nisa.tensor_tensor_scan"
    a, d, _ = _ops.operand(data0, instr, "data0", mask)
    b, _, _ = _ops.operand(data1, instr, "data1", mask)
    if a.shape[0] != b.shape[0] or a.size != b.size:
        _fail(NKIShapeError, instr, "data1", f"shape {b.shape} does not match data0 {a.shape}")
    a2 = a.reshape(a.shape[0], -1).astype(np.float32)
    b2 = b.reshape(b.shape[0], -1).astype(np.float32)
    prev = np.broadcast_to(_scalar_operand(initial, instr, "initial", a.shape[0], 2), (a.shape[0], 1)).reshape(-1)
    f0, f1 = _op_fn(op0, instr, "op0"), _op_fn(op1, instr, "op1")
    out = np.empty_like(a2)
    with np.errstate(all="ignore"):
        for i in range(a2.shape[1]):
            t = f0(prev, a2[:, i]) if reverse0 else f0(a2[:, i], prev)
            t = f1(b2[:, i], t) if reverse1 else f1(t, b2[:, i])
            out[:, i] = t
            prev = out[:, i]
    _ops.charge_elementwise("Vector", instr, a.shape, n_inputs=2)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    return _write_or_new(out.reshape(a.shape), out_d, dst, instr, mask)


@_dst_first(0)
def tensor_reduce(op, data, axis, negate=False, keepdims=False, dtype=None, mask=None, dst=None, name=None):
    """Reduce ``data`` with ``op`` (nl.add / nl.maximum / ...) along free ``axis``; all
    free axes reduced gives [P, 1]."""
    instr = "nisa.tensor_reduce"
    vals, d = _ops.reduce(instr, _reduce_ufunc(op, instr), data, axis, keepdims=keepdims, mask=mask, negate=negate)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    return _write_or_new(vals, out_d, dst, instr)


@_dst_first(0)
def tensor_partition_reduce(op, data, dtype=None, mask=None, dst=None, name=None):
    """Reduce across partitions (axis 0) on the GpSimd Engine -> [1, F]."""
    instr = "nisa.tensor_partition_reduce"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    f = _reduce_ufunc(op, instr)
    x = f.reduce(a.astype(np.float32), axis=0, keepdims=True)
    _ops.charge_elementwise("GpSimd", instr, a.shape)
    return _write_or_new(x, dt.as_dtype(dtype) or d, dst, instr)


@_dst_first(1)
def tensor_copy(src, engine=engine.unknown, dtype=None, mask=None, dst=None, name=None):
    """Copy a tile within SBUF/PSUM (PSUM -> SBUF evacuation), optionally casting."""
    instr = "nisa.tensor_copy"
    return _ops.elementwise(instr, _engine(engine, "Vector"), _math.copy, [src], dtype, mask, dst, names=["src"])


@_dst_first(1)
def tensor_copy_dynamic_src(src, engine=engine.unknown, dtype=None, mask=None, dst=None, name=None):
    """:func:`tensor_copy` whose ``src`` view has a run-time start offset (the simulator
    evaluates offsets eagerly, so any view works)."""
    return tensor_copy(src, engine=engine, dtype=dtype, mask=mask, dst=dst)


@_dst_first(1)
def tensor_copy_dynamic_dst(src, engine=engine.unknown, dtype=None, mask=None, dst=None, name=None):
    """:func:`tensor_copy` whose ``dst`` view has a run-time start offset."""
    if dst is None:
        raise TypeError("nisa.tensor_copy_dynamic_dst: operand 'dst' is required")
    return tensor_copy(src, engine=engine, dtype=dtype, mask=mask, dst=dst)


def tensor_copy_predicated(dst=None, src=None, predicate=None, reverse_pred=False, mask=None, name=None):
    """Copy ``src`` (tile or scalar) into ``dst`` where ``predicate`` is nonzero (or zero
    with ``reverse_pred``); other ``dst`` elements keep their values (Vector Engine)."""
    instr = "nisa.tensor_copy_predicated"
    for name, t in (("dst", dst), ("predicate", predicate)):
        if not isinstance(t, NkiTensor):
            raise TypeError(f"{instr}: operand '{name}' must be a tile")
    pr, pd, _ = _ops.operand(predicate, instr, "predicate", mask)
    if pd.kind not in "iu" and pd.kind != "b":
        _fail(NKIShapeError, instr, "predicate", f"must be an integer tile, got {pd!r}")
    s, _, st = _ops.operand(src, instr, "src", mask)
    if st is not None and s.size != int(np.prod(dst.shape)):
        _fail(NKIShapeError, instr, "src", f"shape {s.shape} does not match dst {dst.shape}")
    sel = pr.reshape(dst.shape) != 0
    if reverse_pred:
        sel = ~sel
    vals = np.broadcast_to(s.reshape(dst.shape) if st is not None else s, dst.shape)
    if mask is not None:
        sel &= np.broadcast_to(np.asarray(mask, bool), dst.shape)
    dst._write(instr, "dst", vals, mask=sel)
    _ops.charge_elementwise("Vector", instr, dst.shape, n_inputs=2)
    return dst


@_dst_first(1)
def reciprocal(data, dtype=None, mask=None, dst=None, name=None):
    """``1 / data`` on the Vector Engine."""
    return _ops.elementwise("nisa.reciprocal", "Vector", lambda a: 1.0 / a, [data], dtype, mask, dst, names=["data"])


def _pattern_values(instr, pattern, offset, channel_multiplier, p, free_shape):
    pat = [list(map(int, s)) for s in pattern]
    steps = [s for s, _ in pat]
    nums = [n for _, n in pat]
    n_free = int(np.prod(free_shape)) if free_shape else 1
    if int(np.prod(nums)) != n_free:
        _fail(
            NKIShapeError,
            instr,
            "pattern",
            f"pattern {pattern} has {int(np.prod(nums))} elements per partition, dst has " f"{n_free}",
        )
    grids = np.meshgrid(*[np.arange(n) * s for s, n in zip(steps, nums)], indexing="ij")
    free = np.sum(grids, axis=0).reshape(-1) if grids else np.zeros(1, np.int64)
    vals = offset + np.arange(p)[:, None] * channel_multiplier + free[None, :]
    return vals.reshape((p,) + tuple(free_shape))


def iota(
    *args, pattern=None, offset=None, channel_multiplier=None, expr=None, dtype=None, mask=None, dst=None, name=None
):
    """Generate an integer pattern (GpSimd): ``iota(dst, pattern, offset=0,
    channel_multiplier=0)``, or the older ``iota(expr, dtype)`` of an index expression."""
    instr = "nisa.iota"
    if args and isinstance(args[0], NkiTensor) and dst is None:
        dst, args = args[0], args[1:]
    if dst is not None:
        pattern = pattern if pattern is not None else (args[0] if args else None)
        offset = offset if offset is not None else (args[1] if len(args) > 1 else 0)
        cm_ = channel_multiplier if channel_multiplier is not None else (args[2] if len(args) > 2 else 0)
        vals = _pattern_values(instr, pattern, int(offset), int(cm_), dst.shape[0], dst.shape[1:])
        _ops.charge_elementwise("GpSimd", instr, dst.shape)
        dst._write(instr, "dst", vals, mask)
        return dst
    expr = expr if expr is not None else (args[0] if args else None)
    dtype = dtype or (args[1] if len(args) > 1 else None)
    vals = np.asarray(expr)
    if vals.ndim == 1:
        vals = vals[None, :]
    _ops.charge_elementwise("GpSimd", instr, vals.shape)
    return _ops.new_tile(vals, dt.as_dtype(dtype) or dt.int32, instr)


def sequence_bounds(*args, segment_ids=None, dst=None, name=None):
    """Bounds of the run of equal segment IDs each element is in (GpSimd Engine):
    ``sequence_bounds(dst, segment_ids)``, or ``sequence_bounds(segment_ids=...)`` returning
    a new tile. ``segment_ids`` is ``[1, n]`` (float32 or int32); the result ``[1, 2, n]``
    holds each element's start index (row 0) and end index, exclusive (row 1). ID 0 marks
    padding, whose bounds are ``n`` and ``-1``."""
    instr = "nisa.sequence_bounds"
    if len(args) == 2 and dst is None and segment_ids is None:
        dst, segment_ids = args
    elif len(args) == 1 and segment_ids is None:
        segment_ids = args[0]
    elif args:
        raise TypeError(f"{instr}: expected (dst, segment_ids) or segment_ids=")
    if segment_ids is None:
        raise TypeError(f"{instr}: missing 'segment_ids'")
    ids, d, _ = _ops.operand(segment_ids, instr, "segment_ids")
    for operand, dtype in (("segment_ids", d), ("dst", None if dst is None else dst.dtype)):
        if dtype is not None and dtype not in (dt.float32, dt.int32):
            _fail(NKIDtypeError, instr, operand, f"must be nl.float32 or nl.int32, got {dtype!r}")
    if ids.ndim != 2 or ids.shape[0] != 1:
        _fail(NKIShapeError, instr, "segment_ids", f"must be a [1, n] tile (one partition), got shape {ids.shape}")
    x = ids[0]
    n = x.size
    idx = np.arange(n)
    change = x[1:] != x[:-1]
    start = np.maximum.accumulate(np.where(np.r_[True, change], idx, 0))
    end = np.minimum.accumulate(np.where(np.r_[change, True], idx + 1, n)[::-1])[::-1]
    pad = x == 0
    vals = np.stack([np.where(pad, n, start), np.where(pad, -1, end)])[None]
    _ops.charge_elementwise("GpSimd", instr, ids.shape)
    return _write_or_new(vals, d or dt.int32, dst, instr)


_MEMSET_FORMS = (
    "call nisa.memset(dst, value) to fill dst, or the older nisa.memset(shape, value, dtype) "
    "to get a new tile; the two forms cannot be mixed"
)


def memset(*args, value=None, dtype=None, engine=engine.unknown, mask=None, dst=None, shape=None, name=None):
    """Fill ``dst`` with ``value``: ``memset(dst, value)``; or the older
    ``memset(shape, value, dtype)`` returning a new tile (Vector Engine)."""
    instr = "nisa.memset"
    given = {"shape": shape, "value": value, "dtype": dtype}
    if dst is None and args and isinstance(args[0], NkiTensor):
        dst, args = args[0], args[1:]
    if dst is not None:
        # AWS's current signature memset(dst, value, engine=..., name=None) lets engine be positional
        if len(args) == 2 and isinstance(args[1], _Engine) and engine is _Engine.unknown:
            engine, args = args[1], args[:1]
        positional = ["value"]
        if shape is not None or dtype is not None or len(args) > len(positional):
            # e.g. memset(t.shape, 0.5, nl.float32, dst=t) would otherwise fill t with the shape's numbers
            raise TypeError(
                f"{instr}: got dst together with a shape, a dtype or extra positional arguments; {_MEMSET_FORMS}"
            )
    else:
        positional = ["shape", "value", "dtype"]
        if len(args) > len(positional):
            raise TypeError(f"{instr}: takes at most 3 positional arguments, got {len(args)}; {_MEMSET_FORMS}")
    for key, arg in zip(positional, args):
        if given[key] is not None:
            raise TypeError(f"{instr}: got multiple values for {key!r}; {_MEMSET_FORMS}")
        given[key] = arg
    missing = [key for key in positional if given[key] is None]
    if missing:
        raise TypeError(f"{instr}: missing {', '.join(repr(k) for k in missing)}; {_MEMSET_FORMS}")
    value = given["value"]
    target_shape = dst.shape if dst is not None else tuple(given["shape"])
    out_d = dst.dtype if dst is not None else dt.as_dtype(given["dtype"])
    _ops.charge_elementwise(_engine(engine, "Vector"), instr, target_shape, n_inputs=0, dtypes=[out_d])
    vals = np.full(target_shape, value, np.float64 if out_d.is_float else np.int64)
    return _write_or_new(vals, out_d, dst, instr, mask)


def affine_select(
    *args,
    pattern=None,
    channel_multiplier=None,
    on_true_tile=None,
    on_false_value=None,
    cmp_op=None,
    offset=None,
    pred=None,
    dtype=None,
    mask=None,
    dst=None,
    name=None,
):
    """Select ``on_true_tile`` where an affine predicate holds, else ``on_false_value``
    (GpSimd). Current form: ``affine_select(dst, pattern, channel_multiplier,
    on_true_tile, on_false_value, cmp_op=nl.equal, offset=0)`` with predicate
    ``cmp_op(offset + p * channel_multiplier + pattern, 0)``; older form
    ``affine_select(pred, on_true_tile, on_false_value)`` with an index expression."""
    instr = "nisa.affine_select"
    if (
        args
        and isinstance(args[0], NkiTensor)
        and dst is None
        and not (len(args) > 1 and isinstance(args[1], NkiTensor))
    ):
        dst, args = args[0], args[1:]
    given = {
        "pattern": pattern,
        "channel_multiplier": channel_multiplier,
        "on_true_tile": on_true_tile,
        "on_false_value": on_false_value,
        "cmp_op": cmp_op,
        "offset": offset,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if dst is not None or pattern is not None:
        names = ["pattern", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op", "offset"]
        vals = dict(zip(names, args))
        vals.update(given)
        on_true = vals["on_true_tile"]
        a, d, _ = _ops.operand(on_true, instr, "on_true_tile", mask)
        aff = _pattern_values(
            instr, vals["pattern"], int(vals.get("offset", 0)), int(vals["channel_multiplier"]), a.shape[0], a.shape[1:]
        )
        cmp = _op_fn(vals.get("cmp_op", nl.equal), instr, "cmp_op")
        pred = np.asarray(cmp(aff, 0), bool)
    else:
        pos_pred, on_true, on_false = (list(args) + [None] * 3)[:3]
        pred = pos_pred if pred is None else pred
        on_true = given.get("on_true_tile", on_true)
        vals = {"on_false_value": given.get("on_false_value", on_false)}
        a, d, _ = _ops.operand(on_true, instr, "on_true_tile", mask)
        if isinstance(pred, NkiTensor):
            pred, _, _ = _ops.operand(pred, instr, "pred")
        pred = np.broadcast_to(np.asarray(pred), a.shape).astype(bool)
    out = np.where(pred.reshape(a.shape), a.astype(np.float32), vals["on_false_value"])
    _ops.charge_elementwise("GpSimd", instr, a.shape)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    return _write_or_new(out, out_d, dst, instr, mask)


@_dst_first(1)
def range_select(
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=reduce_cmd.reset_reduce,
    reduce_res=None,
    reduce_op=None,
    range_start=0,
    on_false_value=nl.fp32.min,
    dtype=None,
    dst=None,
    name=None,
):
    """Keep elements whose free index + ``range_start`` passes both comparisons with the
    per-partition bounds, else ``on_false_value``; max-reduce into ``reduce_res``."""
    instr = "nisa.range_select"
    a, d, _ = _ops.operand(on_true_tile, instr, "on_true_tile")
    a2 = a.reshape(a.shape[0], -1).astype(np.float32)
    b0 = _scalar_operand(bound0, instr, "bound0", a.shape[0], 2)
    b1 = _scalar_operand(bound1, instr, "bound1", a.shape[0], 2)
    idx = (range_start + np.arange(a2.shape[1], dtype=np.float32))[None, :]
    c0, c1 = _op_fn(comp_op0, instr, "comp_op0"), _op_fn(comp_op1, instr, "comp_op1")
    keep = np.asarray(c0(idx, b0), bool) & np.asarray(c1(idx, b1), bool)
    out = np.where(keep, a2, np.float32(on_false_value)).reshape(a.shape)
    _ops.charge_elementwise("Vector", instr, a.shape)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    rounded = dt.round_to(out, out_d)
    _reduce_into(instr, "Vector", rounded, reduce_op or np.maximum, reduce_res, reduce_cmd)
    return _write_or_new(rounded, out_d, dst, instr)


@_dst_first(2)
def select_reduce(
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    reduce_op=None,
    reverse_pred=False,
    dtype=None,
    dst=None,
    name=None,
):
    """``where(predicate, on_true, on_false)`` (on_false scalar or [P, 1]), with an optional
    max reduction into ``reduce_res`` (Vector Engine)."""
    instr = "nisa.select_reduce"
    pr, _, _ = _ops.operand(predicate, instr, "predicate")
    a, d, _ = _ops.operand(on_true, instr, "on_true")
    sel = pr.reshape(a.shape) != 0
    if reverse_pred:
        sel = ~sel
    f = _scalar_operand(on_false, instr, "on_false", a.shape[0], a.ndim)
    out = np.where(sel, a.astype(np.float32), f)
    _ops.charge_elementwise("Vector", instr, a.shape, n_inputs=2)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    rounded = dt.round_to(out, out_d)
    if reduce_res is not None or reduce_cmd not in (reduce_cmd.idle, None):
        _reduce_into(
            instr,
            "Vector",
            rounded,
            reduce_op or np.maximum,
            reduce_res,
            reduce_cmd if reduce_cmd is not globals()["reduce_cmd"].idle else globals()["reduce_cmd"].reset_reduce,
        )
    return _write_or_new(rounded, out_d, dst, instr)


@_dst_first(1)
def max8(src, dtype=None, mask=None, dst=None, name=None):
    """The 8 largest values of each partition, descending, as [P, 8] (Vector Engine)."""
    instr = "nisa.max8"
    a, d, _ = _ops.operand(src, instr, "src", mask)
    flat = a.reshape(a.shape[0], -1).astype(np.float32)
    if not 8 <= flat.shape[1] <= 16384:
        _fail(NKITileSizeError, instr, "src", f"{flat.shape[1]} elements per partition; max8 reads 8 to 16384")
    top = -np.sort(-flat, axis=1)[:, :8]
    _ops.charge_elementwise("Vector", instr, a.shape)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else d)
    return _write_or_new(top, out_d, dst, instr)


def _check8(instr, data, vals):
    a, _, _ = _ops.operand(data, instr, "data")
    v, _, _ = _ops.operand(vals, instr, "vals")
    flat = a.reshape(a.shape[0], -1).astype(np.float32)
    v8 = v.reshape(v.shape[0], -1).astype(np.float32)
    if v8.shape != (flat.shape[0], 8):
        _fail(
            NKIShapeError,
            instr,
            "vals",
            f"must hold exactly 8 values per partition for {flat.shape[0]} partitions, got " f"shape {v.shape}",
        )
    if not 8 <= flat.shape[1] <= 16384:
        _fail(
            NKITileSizeError, instr, "data", f"{flat.shape[1]} elements per partition; the instruction reads 8 to 16384"
        )
    return a, flat, v8


@_dst_first(2)
def nc_find_index8(data, vals, dtype=None, dst=None, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` per partition (duplicates
    take successive occurrences); all-ones when absent. uint32 by default."""
    instr = "nisa.nc_find_index8"
    _, flat, v8 = _check8(instr, data, vals)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else dt.uint32)
    sentinel = np.iinfo(out_d.np_storage).max
    out = np.full(v8.shape, sentinel, np.int64)
    for p in range(flat.shape[0]):
        used = set()
        for i in range(8):
            hits = [j for j in np.flatnonzero(flat[p] == v8[p, i]) if j not in used]
            if hits:
                out[p, i] = hits[0]
                used.add(hits[0])
    _ops.charge_elementwise("Vector", instr, flat.shape)
    return _write_or_new(out, out_d, dst, instr)


@_dst_first(2)
def nc_match_replace8(data, vals, imm, dst_idx=None, dtype=None, dst=None, name=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced
    by ``imm`` (vals matched from last to first); their indices go to ``dst_idx``."""
    instr = "nisa.nc_match_replace8"
    a, flat, v8 = _check8(instr, data, vals)
    out = flat.copy()
    idx = np.full(v8.shape, np.iinfo(np.uint32).max, np.int64)
    for p in range(flat.shape[0]):
        used = set()
        for i in range(7, -1, -1):
            hits = [j for j in np.flatnonzero(flat[p] == v8[p, i]) if j not in used]
            if hits:
                idx[p, i] = hits[0]
                used.add(hits[0])
                out[p, hits[0]] = imm
    if dst_idx is not None:
        dst_idx._write(instr, "dst_idx", idx)
    _ops.charge_elementwise("Vector", instr, flat.shape)
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else data.dtype)
    return _write_or_new(out.reshape(a.shape), out_d, dst, instr)


@_dst_first(2)
def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, dst=None, name=None):
    """GpSimd gather: each core of 16 partitions flattens its index slice (partition
    first) and every partition gathers ``num_elem_per_idx`` contiguous elements at each
    index (an element offset into its flattened free axes)."""
    instr = "nisa.local_gather"
    a, d, _ = _ops.operand(src_buffer, instr, "src_buffer")
    ix, di, _ = _ops.operand(index, instr, "index")
    if a.shape[0] != ix.shape[0] or a.shape[0] % 16:
        _fail(
            NKIShapeError,
            instr,
            "index",
            f"partition sizes {a.shape[0]} and {ix.shape[0]} must match and be a multiple " f"of 16",
        )
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        _fail(NKIShapeError, instr, "num_elem_per_idx", f"{num_elem_per_idx} is not one of 1, 2, 4, 8, 16, 32")
    flat = a.reshape(a.shape[0], -1)
    per_core = ix.size // (ix.shape[0] // 16)
    n = per_core if num_valid_indices is None else int(num_valid_indices)
    out = np.empty((a.shape[0], n, num_elem_per_idx), flat.dtype)
    for c in range(a.shape[0] // 16):
        rows = slice(16 * c, 16 * (c + 1))
        idx = ix[rows].reshape(16, -1).flatten(order="F")[:n].astype(np.int64)
        if (idx < 0).any() or (idx + num_elem_per_idx > flat.shape[1]).any():
            _fail(NKIShapeError, instr, "index", "index out of range of src_buffer")
        cols = idx[:, None] + np.arange(num_elem_per_idx)[None, :]
        out[rows] = flat[rows][:, cols]
    _ops.charge_elementwise("GpSimd", instr, out.shape)
    # all indices valid: [P, index free..., 16 partitions, elements] (the flattening order)
    full = (a.shape[0],) + tuple(ix.shape[1:]) + (16, num_elem_per_idx)
    shape = dst.shape if dst is not None else (full if n == per_core else out.shape)
    return _write_or_new(out.reshape(shape), d, dst, instr)


@_dst_first(1)
def dropout(data, prob, dtype=None, dst=None, name=None):
    """Zero each element with probability ``prob`` (scalar or [P, 1]); no rescale."""
    res = nl.dropout(data, prob, dtype=dtype or (dst.dtype if dst is not None else None))
    return _ops.finish(res, dst, "nisa.dropout")


@_dst_first(1)
def nc_stream_shuffle(src, shuffle_mask, dst=None, name=None):
    """Cross-partition move within each 32-partition quadrant: output partition i of a
    quadrant copies input partition ``shuffle_mask[i]`` (255 leaves it unmodified)."""
    instr = "nisa.nc_stream_shuffle"
    if dst is None:
        raise TypeError(f"{instr}: operand 'dst' is required")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32:
        _fail(NKIShapeError, instr, "shuffle_mask", f"needs 32 entries, got {len(mask)}")
    a, d, _ = _ops.operand(src, instr, "src")
    if dst.dtype is not d or a.size // a.shape[0] != int(np.prod(dst.shape[1:])):
        _fail(NKIShapeError, instr, "dst", "must match src dtype and elements per partition")
    src2 = a.reshape(a.shape[0], -1).copy()
    sel = np.zeros(dst.shape[0], bool)
    vals = np.zeros((dst.shape[0], src2.shape[1]), src2.dtype)
    for q in range(0, dst.shape[0], 32):
        for i, m in enumerate(mask):
            if m == 255 or q + i >= dst.shape[0]:
                continue
            if q + m >= src2.shape[0]:
                _fail(
                    NKIShapeError,
                    instr,
                    "shuffle_mask",
                    f"entry {m} selects partition {q + m} beyond src's {src2.shape[0]}",
                )
            vals[q + i], sel[q + i] = src2[q + m], True
    m2 = np.broadcast_to(sel.reshape((-1,) + (1,) * (dst.ndim - 1)), dst.shape)
    dst._write(instr, "dst", vals.reshape(dst.shape), mask=m2)
    _ops.charge_elementwise("Vector", instr, dst.shape)
    return dst


def core_barrier(*args, **kwargs):
    """Not simulated: programs of a grid run one after another on one simulated core."""
    raise NotImplementedError(
        "nisa.core_barrier: synchronising NeuronCores is not simulated (the programs of a "
        "launch grid run one after another on one simulated core, so a barrier between them "
        "cannot be honoured)"
    )


def sendrecv(*args, **kwargs):
    """Not simulated: there is no peer NeuronCore to exchange data with."""
    raise NotImplementedError(
        "nisa.sendrecv: point-to-point transfers between NeuronCores are not simulated (a "
        "simulated kernel runs on one NeuronCore); use torch.distributed with the 'neuron' "
        "backend"
    )


@_dst_first(1)
def bn_stats(data, dtype=None, mask=None, dst=None, name=None):
    """Per-partition mean/variance statistics of a [P, F<=512] tile (Vector Engine).

    The 6 output values per partition hold (count, mean, variance) of the even and the
    odd free elements; :func:`bn_aggr` combines any number of such groups. Masked-off
    elements are not counted.
    """
    instr = "nisa.bn_stats"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    if a.ndim != 2:
        _fail(NKIShapeError, instr, "data", f"must be a 2-D tile, got {a.shape}")
    if a.shape[1] > 512:
        _fail(NKITileSizeError, instr, "data", f"free size {a.shape[1]} exceeds nl.tile_size.bn_stats_fmax=512")
    x = a.astype(np.float64)
    live = np.ones(a.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), a.shape)
    out = np.zeros((a.shape[0], 6), np.float64)
    for j in range(2):
        xs, ls = x[:, j::2], live[:, j::2]
        n = ls.sum(axis=1)
        s = np.where(ls, xs, 0).sum(axis=1)
        mean = np.divide(s, n, out=np.zeros_like(s), where=n > 0)
        sq = np.where(ls, (xs - mean[:, None]) ** 2, 0).sum(axis=1)
        out[:, 3 * j] = n
        out[:, 3 * j + 1] = mean
        out[:, 3 * j + 2] = np.divide(sq, n, out=np.zeros_like(sq), where=n > 0)
    _ops.charge_elementwise("Vector", instr, a.shape, dtypes=[d])
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else dt.float32)
    return _write_or_new(out, out_d, dst, instr)


@_dst_first(1)
def bn_aggr(data, dtype=None, mask=None, dst=None, name=None):
    """Combine :func:`bn_stats` groups [P, 6*k] into [P, 2] = (mean, variance)."""
    instr = "nisa.bn_aggr"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    if a.ndim != 2 or a.shape[1] % 3:
        _fail(NKIShapeError, instr, "data", f"expects [P, 6*k] bn_stats output, got {a.shape}")
    g = a.astype(np.float64).reshape(a.shape[0], -1, 3)
    n, mu, var = g[..., 0], g[..., 1], g[..., 2]
    total = n.sum(axis=1)
    mean = (n * mu).sum(axis=1) / total
    m2 = (n * (var + (mu - mean[:, None]) ** 2)).sum(axis=1)
    out = np.stack([mean, m2 / total], axis=1)
    _ops.charge_elementwise("Vector", instr, a.shape, dtypes=[d])
    out_d = dt.as_dtype(dtype) or (dst.dtype if dst is not None else dt.float32)
    return _write_or_new(out, out_d, dst, instr)


# ----- DMA ----------------------------------------------------------------------------------------
def _dma_bytes(dst, src, n):
    """HBM bytes a DMA moves: each HBM-side operand in its own dtype (an fp32 -> bf16
    store writes 2 bytes per element); SBUF -> SBUF counts the destination."""
    hbm = [t for t in (src, dst) if t.buffer in _ops.HBM]
    return n * (sum(t.itemsize for t in hbm) if hbm else dst.itemsize)


def _in_bounds(t):
    """Bool array (view shape) of elements whose index-array indices are in bounds."""
    ok = np.ones(t.shape, bool)
    if t._adv is not None:
        for a, n in zip(t._adv, t._view.shape):
            ok &= (a >= 0) & (a < n)
    return ok


def dma_copy(
    dst=None,
    src=None,
    mask=None,
    dge_mode=None,
    oob_mode=None,
    dst_rmw_op=None,
    priority=None,
    engine=None,
    unique_indices=True,
    name=None,
):
    """Copy between HBM and SBUF (either direction, HBM->HBM or SBUF->SBUF) on a DMA engine.

    ``dst_rmw_op`` (e.g. ``np.add``) writes ``op(dst, src)`` (read-modify-write);
    ``oob_mode=nisa.oob_mode.skip`` skips elements whose indirect index is out of bounds
    (the default raises).
    """
    instr = "nisa.dma_copy"
    for t, n in ((dst, "dst"), (src, "src")):
        if not isinstance(t, NkiTensor):
            raise TypeError(f"{instr}: operand '{n}' must be a tensor")
        if t.buffer == "psum":
            _fail(NKIBufferError, instr, n, "tile in PSUM; DMA engines access HBM and SBUF only")
    if dst.shape != src.shape and int(np.prod(dst.shape)) != int(np.prod(src.shape)):
        _fail(NKIShapeError, instr, "src", f"shape {src.shape} does not match dst {dst.shape}")
    if src.buffer == "sbuf":
        rules.check_partition(current_run().hw, instr, "src", src.shape)
    if dst.buffer == "sbuf":
        rules.check_partition(current_run().hw, instr, "dst", dst.shape)
    if oob_mode is not None and oob_mode not in (globals()["oob_mode"].error, globals()["oob_mode"].skip):
        raise ValueError(f"{instr}: unknown oob_mode {oob_mode!r}")
    if oob_mode is globals()["oob_mode"].skip:
        live = _in_bounds(dst) & np.reshape(_in_bounds(src), dst.shape)
        if mask is not None:
            live &= np.broadcast_to(np.asarray(mask, bool), dst.shape)
        mask = live
    src_mask = None if mask is None else np.reshape(np.broadcast_to(mask, dst.shape), src.shape)
    vals = np.asarray(src._read(instr, "src", src_mask))
    if dst.shape != src.shape:
        vals = np.reshape(vals, dst.shape)
    if dst_rmw_op is not None:
        f = _op_fn(dst_rmw_op, instr, "dst_rmw_op")
        with np.errstate(all="ignore"):
            vals = f(np.asarray(dst._read(instr, "dst", mask), np.float32), vals)
    dst._write(instr, "dst", vals, mask)
    n = int(np.count_nonzero(np.broadcast_to(mask, dst.shape))) if mask is not None else int(np.prod(dst.shape))
    nbytes = _dma_bytes(dst, src, n) + (n * dst.itemsize if dst_rmw_op is not None else 0)
    _ops.charge_dma(instr, nbytes)
    return dst


_DMA_T_PERM = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst=None, src=None, axes=None, mask=None, dge_mode=None, name=None):
    """Transpose ``src`` into ``dst`` on the DMA engines: 2-D (1, 0), 3-D (2, 1, 0),
    4-D (3, 1, 2, 0), or the permutation ``axes``; 2- or 4-byte dtypes."""
    instr = "nisa.dma_transpose"
    if src is None and isinstance(dst, NkiTensor):
        dst, src = None, dst  # older form dma_transpose(src): returns a new SBUF tile
    if dst is None and isinstance(src, NkiTensor):
        perm = tuple(axes) if axes is not None else _DMA_T_PERM.get(src.ndim, ())
        shape = tuple(src.shape[i] for i in perm) if perm else src.shape
        rules.check_partition(current_run().hw, instr, "result", shape)
        dst = _ops.new_storage(shape, src.dtype, "sbuf", _ops._name("dma_transpose"))
    for t, n in ((dst, "dst"), (src, "src")):
        if not isinstance(t, NkiTensor):
            raise TypeError(f"{instr}: operand '{n}' must be a tensor")
        if t.buffer == "psum":
            _fail(NKIBufferError, instr, n, "tile in PSUM; DMA engines access HBM and SBUF only")
    if src.itemsize not in (2, 4):
        _fail(NKIShapeError, instr, "src", f"dtype {src.dtype!r}: DMA transpose moves 2- or 4-byte elements only")
    perm = tuple(axes) if axes is not None else _DMA_T_PERM.get(src.ndim)
    if perm is None or sorted(perm) != list(range(src.ndim)):
        _fail(NKIShapeError, instr, "src", f"cannot transpose a {src.ndim}-D tensor")
    vals = np.transpose(src._read(instr, "src"), perm)
    if int(np.prod(vals.shape)) != int(np.prod(dst.shape)):
        _fail(NKIShapeError, instr, "dst", f"shape {dst.shape} does not hold the transposed {vals.shape}")
    if dst.buffer == "sbuf":
        rules.check_partition(current_run().hw, instr, "dst", dst.shape)
    dst._write(instr, "dst", vals.reshape(dst.shape), mask)
    _ops.charge_dma(instr, _dma_bytes(dst, src, int(np.prod(dst.shape))))
    return dst


_kwcheck.install(globals(), "nisa", open_ended=("core_barrier", "sendrecv"))
