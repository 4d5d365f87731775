"""``nki.isa`` (``nisa``): direct NeuronCore instructions on the simulated core.

Names/arguments follow AWS's public ``nki.isa`` reference. Each instruction accepts
the optional ``dst=`` of the current (beta 2) API; without it a new tile is returned.
"""

import enum

import numpy as np

from . import _cost_model as cm
from . import _dtypes as dt
from . import _ops
from . import _rules as rules
from ._errors import NKIBufferError, NKIShapeError, NKITileSizeError, _fail
from ._simulator import current_run
from ._tensor import NkiTensor


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


_ENGINE_NAME = {engine.tensor: "Tensor", engine.vector: "Vector", engine.scalar: "Scalar",
                engine.gpsimd: "GpSimd"}


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version():
    """NeuronCore generation of the simulated target (trn2 -> gen3, trn3 -> gen4)."""
    return nc_version.gen3 if current_run().hw.name == "trn2" else nc_version.gen4


def _op_fn(op, instr, operand="op"):
    """Accept nl ops (nl.add, nl.exp, ...) and NumPy ufuncs (np.add, ...)."""
    if hasattr(op, "fn") and hasattr(op, "arity"):
        return op.fn
    if isinstance(op, np.ufunc):
        return op
    if callable(op):
        return op
    raise TypeError(f"{instr}: operand '{operand}': unsupported op {op!r}")


def _reduce_ufunc(op, instr, operand="op"):
    """Reduction operator as a NumPy ufunc: nl.add/np.add, nl.maximum, nl.sum, nl.max, np.max..."""
    from . import language as nl
    by_reduction = {nl.sum: np.add, nl.max: np.maximum, nl.min: np.minimum, nl.prod: np.multiply,
                    np.sum: np.add, np.max: np.maximum, np.min: np.minimum,
                    np.prod: np.multiply}
    for k, v in by_reduction.items():
        if op is k:
            return v
    f = _op_fn(op, instr, operand)
    if not isinstance(f, np.ufunc):
        _fail(NKIShapeError, instr, operand, f"{op!r} is not a reduction operator")
    return f


def _engine(eng, default):
    return _ENGINE_NAME.get(eng, default) if eng is not None else default


# ----- Tensor Engine -------------------------------------------------------------------------
def _matmul(instr, stationary, moving, name_st="stationary", name_mv="moving"):
    run = current_run()
    for t, n in ((stationary, name_st), (moving, name_mv)):
        if not isinstance(t, NkiTensor):
            raise TypeError(f"{instr}: operand '{n}' must be a tile")
        if t.buffer != "sbuf":
            _fail(NKIBufferError, instr, n,
                  f"tile in {t.buffer.upper()}; the Tensor Engine reads SBUF only")
    rules.check_matmul(run.hw, instr, stationary.shape, moving.shape,
                       stationary.dtype, moving.dtype, names=(name_st, name_mv))
    a, _, _ = _ops.operand(stationary, instr, name_st)
    b, _, _ = _ops.operand(moving, instr, name_mv)
    vals = a.astype(np.float32).T @ b.astype(np.float32)
    fp32 = dt.float32 in (stationary.dtype, moving.dtype)
    k, m = stationary.shape
    n = moving.shape[1]
    run.ledger.charge("Tensor", instr, cm.matmul_seconds(run.hw, n, fp32), flops=2.0 * k * m * n)
    return _ops.new_tile(vals, dt.float32, instr, buffer="psum")


def _transpose_pe(instr, x, name):
    run = current_run()
    if not isinstance(x, NkiTensor) or x.ndim != 2:
        _fail(NKIShapeError, instr, name, "transpose needs a 2-D tile")
    if x.buffer != "sbuf":
        _fail(NKIBufferError, instr, name,
              f"tile in {x.buffer.upper()}; the Tensor Engine reads SBUF only")
    p, f = x.shape
    rules.check_partition(run.hw, instr, name, x.shape)
    if f > run.hw.pmax:
        _fail(NKITileSizeError, instr, name,
              f"free size {f} exceeds {run.hw.pmax}: it becomes the partition dimension of "
              f"the transposed tile (nl.tile_size.pmax)")
    a, _, _ = _ops.operand(x, instr, name)
    run.ledger.charge("Tensor", instr, cm.matmul_seconds(run.hw, p, x.dtype is dt.float32))
    return _ops.new_tile(a.T, x.dtype, instr, buffer="psum")


def nc_matmul(stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, mask=None, dst=None, accumulate=None, **kwargs):
    """``stationary.T @ moving`` on the Tensor Engine (stationary [K, M], moving [K, N]).

    Returns a new PSUM fp32 tile [M, N], or writes ``dst`` (accumulating into it
    unless ``accumulate=False``, which is how K > 128 contractions are tiled).
    """
    instr = "nisa.nc_matmul"
    if is_transpose:
        return nc_transpose(moving, engine=engine.tensor, dst=dst)
    res = _matmul(instr, stationary, moving)
    if dst is not None:
        if dst.buffer != "psum":
            _fail(NKIBufferError, instr, "dst", f"tile in {dst.buffer.upper()}; nc_matmul "
                  f"writes PSUM only")
        rules.check_psum_dtype(current_run().hw, instr, "dst", dst.dtype)
    return _ops.finish(res, dst, instr, accumulate=accumulate is not False)


def nc_transpose(data, engine=engine.unknown, dst=None, **kwargs):
    """Partition <-> free transpose: Tensor Engine (<=128x128, to PSUM) or Vector (<=32x32)."""
    instr = "nisa.nc_transpose"
    if engine is globals()["engine"].vector:
        a, d, _ = _ops.operand(data, instr, "data")
        if a.ndim != 2 or a.shape[0] > 32 or a.shape[1] > 32:
            _fail(NKITileSizeError, instr, "data",
                  f"Vector Engine transpose supports tiles up to 32x32, got {a.shape}")
        _ops.charge_elementwise("Vector", instr, a.shape)
        res = _ops.new_tile(a.T, d, instr)
    else:
        res = _transpose_pe(instr, data, "data")
    return _ops.finish(res, dst, instr)


# ----- Vector / Scalar / GpSimd ------------------------------------------------------------
def _scalar_operand(x, instr, name, p):
    """A scalar or a per-partition [P, 1] vector tile broadcast along the free axis."""
    if isinstance(x, NkiTensor):
        a, _, _ = _ops.operand(x, instr, name)
        if a.ndim < 2 or a.shape[0] not in (1, p) or int(np.prod(a.shape[1:])) != 1:
            _fail(NKIShapeError, instr, name,
                  f"must be a scalar or a [{p}, 1] per-partition tile, got shape {a.shape}")
        return a.reshape(a.shape[0], 1).astype(np.float32)
    return np.float32(x)


def activation(op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=None, dtype=None, mask=None, dst=None, **kwargs):
    """``op(data * scale + bias)`` on the Scalar Engine, with optional free-axis reduction."""
    instr = "nisa.activation"
    fn = _op_fn(op, instr)
    a, d, _ = _ops.operand(data, instr, "data", mask)
    p = a.shape[0]
    x = a.astype(np.float32) * _scalar_operand(scale, instr, "scale", p).reshape(
        (-1,) + (1,) * (a.ndim - 1) if isinstance(scale, NkiTensor) else ())
    if bias is not None:
        x = x + _scalar_operand(bias, instr, "bias", p).reshape(
            (-1,) + (1,) * (a.ndim - 1) if isinstance(bias, NkiTensor) else ())
    with np.errstate(all="ignore"):
        vals = fn(x)
    _ops.charge_elementwise("Scalar", instr, a.shape)
    res = _ops.new_tile(vals, dt.as_dtype(dtype) or d, instr)
    if reduce_op is not None:
        if reduce_res is None:
            _fail(NKIShapeError, instr, "reduce_res", "reduce_op needs a reduce_res tile")
        red = _reduce_ufunc(reduce_op, instr, "reduce_op")
        rv = red.reduce(res._view.reshape(p, -1).astype(np.float32), axis=1)
        reduce_res._write(instr, "reduce_res", rv.reshape(reduce_res.shape))
    return _ops.finish(res, dst, instr, mask=mask)


def activation_reduce(op, data, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None,
                      mask=None, dst=None, **kwargs):
    """:func:`activation` plus a free-axis reduction of its result into ``reduce_res``."""
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, dtype=dtype, mask=mask, dst=dst)


def tensor_tensor(data1, data2, op, engine=engine.unknown, dtype=None, mask=None, dst=None,
                  **kwargs):
    """Elementwise ``op(data1, data2)`` of two same-shape tiles (Vector or GpSimd)."""
    instr = "nisa.tensor_tensor"
    if isinstance(data1, NkiTensor) and isinstance(data2, NkiTensor) and \
            data1.buffer == "psum" and data2.buffer == "psum":
        _fail(NKIBufferError, instr, "data2",
              "both operands in PSUM; the engines read at most one operand from PSUM")
    if isinstance(data1, NkiTensor) and isinstance(data2, NkiTensor) and \
            data1.shape != data2.shape:
        _fail(NKIShapeError, instr, "data2",
              f"shape {data2.shape} differs from data1 shape {data1.shape}")
    return _ops.elementwise(instr, _engine(engine, "Vector"), _op_fn(op, instr),
                            [data1, data2], dtype, mask, dst, names=["data1", "data2"])


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=engine.unknown, dtype=None, mask=None, dst=None,
                  **kwargs):
    """``(data op0 operand0) op1 operand1`` with scalar / [P, 1] operands."""
    instr = "nisa.tensor_scalar"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    p = a.shape[0]

    def apply(x, op, operand, reverse, name):
        v = _scalar_operand(operand, instr, name, p)
        if isinstance(operand, NkiTensor):
            v = v.reshape((-1,) + (1,) * (x.ndim - 1))
        f = _op_fn(op, instr, name.replace("operand", "op"))
        return f(v, x) if reverse else f(x, v)

    with np.errstate(all="ignore"):
        x = apply(a.astype(np.float32), op0, operand0, reverse0, "operand0")
        if op1 is not None:
            x = apply(x, op1, operand1, reverse1, "operand1")
    _ops.charge_elementwise(_engine(engine, "Vector"), instr, a.shape)
    res = _ops.new_tile(x, dt.as_dtype(dtype) or d, instr)
    return _ops.finish(res, dst, instr, mask=mask)


def scalar_tensor_tensor(data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         dtype=None, mask=None, dst=None, **kwargs):
    """``(data op0 operand0) op1 operand1``: operand0 scalar/[P,1], operand1 a tile."""
    instr = "nisa.scalar_tensor_tensor"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    v = _scalar_operand(operand0, instr, "operand0", a.shape[0])
    if isinstance(operand0, NkiTensor):
        v = v.reshape((-1,) + (1,) * (a.ndim - 1))
    b, d2, _ = _ops.operand(operand1, instr, "operand1", mask)
    f0, f1 = _op_fn(op0, instr, "op0"), _op_fn(op1, instr, "op1")
    with np.errstate(all="ignore"):
        x = f0(v, a.astype(np.float32)) if reverse0 else f0(a.astype(np.float32), v)
        x = f1(b.astype(np.float32), x) if reverse1 else f1(x, b.astype(np.float32))
    _ops.charge_elementwise("Vector", instr, a.shape)
    res = _ops.new_tile(x, dt.as_dtype(dtype) or dt.promote(d, d2), instr)
    return _ops.finish(res, dst, instr, mask=mask)


def tensor_reduce(op, data, axis, negate=False, keepdims=False, dtype=None, mask=None,
                  dst=None, **kwargs):
    """Reduce ``data`` with ``op`` (nl.add / nl.maximum / ...) along free ``axis``."""
    instr = "nisa.tensor_reduce"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    rules.check_free_axes(instr, "data", axis, a.ndim)
    f = _reduce_ufunc(op, instr)
    ax = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    x = a.astype(np.float32) if a.dtype.kind == "f" else a
    with np.errstate(all="ignore"):
        for k in sorted(ax, reverse=True):
            x = f.reduce(x, axis=k, keepdims=keepdims)
    if negate:
        x = -x
    _ops.charge_elementwise("Vector", instr, a.shape)
    res = _ops.new_tile(x, dt.as_dtype(dtype) or d, instr)
    return _ops.finish(res, dst, instr)


def tensor_partition_reduce(op, data, dtype=None, mask=None, **kwargs):
    """Reduce across partitions (axis 0) on the GpSimd Engine -> [1, F]."""
    instr = "nisa.tensor_partition_reduce"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    f = _reduce_ufunc(op, instr)
    x = f.reduce(a.astype(np.float32), axis=0, keepdims=True)
    _ops.charge_elementwise("GpSimd", instr, a.shape)
    return _ops.new_tile(x, dt.as_dtype(dtype) or d, instr)


def tensor_copy(src, engine=engine.unknown, dtype=None, mask=None, dst=None, **kwargs):
    """Copy a tile within SBUF/PSUM (PSUM -> SBUF evacuation), optionally casting."""
    instr = "nisa.tensor_copy"
    return _ops.elementwise(instr, _engine(engine, "Vector"), lambda a: a, [src], dtype, mask,
                            dst, names=["src"])


def reciprocal(data, dtype=None, mask=None, dst=None, **kwargs):
    """``1 / data`` on the Vector Engine."""
    return _ops.elementwise("nisa.reciprocal", "Vector", lambda a: 1.0 / a, [data], dtype,
                            mask, dst, names=["data"])


def iota(expr, dtype, mask=None, dst=None, **kwargs):
    """Materialise an index expression (``nl.arange``/``nl.mgrid`` arithmetic) as a tile."""
    instr = "nisa.iota"
    vals = np.asarray(expr)
    if vals.ndim == 1:
        vals = vals[None, :]
    d = dt.as_dtype(dtype)
    _ops.charge_elementwise("GpSimd", instr, vals.shape)
    res = _ops.new_tile(vals, d, instr)
    return _ops.finish(res, dst, instr)


def memset(shape, value, dtype, engine=engine.unknown, mask=None, dst=None, **kwargs):
    """A new tile of ``shape`` filled with ``value`` (Vector Engine)."""
    instr = "nisa.memset"
    if dst is not None and shape is None:
        shape = dst.shape
    shape = tuple(shape)
    _ops.charge_elementwise(_engine(engine, "Vector"), instr, shape)
    res = _ops.new_tile(np.full(shape, value, np.float32), dt.as_dtype(dtype), instr)
    return _ops.finish(res, dst, instr)


def affine_select(pred, on_true_tile, on_false_value, dtype=None, mask=None, **kwargs):
    """``where(pred, on_true_tile, on_false_value)`` with an index predicate (GpSimd)."""
    instr = "nisa.affine_select"
    a, d, _ = _ops.operand(on_true_tile, instr, "on_true_tile", mask)
    p = np.asarray(pred)
    if isinstance(pred, NkiTensor):
        p, _, _ = _ops.operand(pred, instr, "pred")
    vals = np.where(np.broadcast_to(p, a.shape).astype(bool), a, on_false_value)
    _ops.charge_elementwise("GpSimd", instr, a.shape)
    return _ops.new_tile(vals, dt.as_dtype(dtype) or d, instr)


def bn_stats(data, dtype=None, mask=None, **kwargs):
    """Per-partition mean/variance statistics of a [P, F<=512] tile (Vector Engine).

    The 6 output values per partition hold (count, mean, variance) of the even and the
    odd free elements; :func:`bn_aggr` combines any number of such groups.
    """
    instr = "nisa.bn_stats"
    a, d, _ = _ops.operand(data, instr, "data", mask)
    if a.ndim != 2:
        _fail(NKIShapeError, instr, "data", f"must be a 2-D tile, got {a.shape}")
    if a.shape[1] > 512:
        _fail(NKITileSizeError, instr, "data",
              f"free size {a.shape[1]} exceeds nl.tile_size.bn_stats_fmax=512")
    x = a.astype(np.float64)
    out = np.zeros((a.shape[0], 6), np.float64)
    for j, half in enumerate((x[:, 0::2], x[:, 1::2])):
        n = half.shape[1]
        out[:, 3 * j] = n
        if n:
            out[:, 3 * j + 1] = half.mean(axis=1)
            out[:, 3 * j + 2] = half.var(axis=1)
    _ops.charge_elementwise("Vector", instr, a.shape)
    return _ops.new_tile(out, dt.as_dtype(dtype) or dt.float32, instr)


def bn_aggr(data, dtype=None, mask=None, **kwargs):
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
    _ops.charge_elementwise("Vector", instr, a.shape)
    return _ops.new_tile(out, dt.as_dtype(dtype) or dt.float32, instr)


# ----- DMA ----------------------------------------------------------------------------------------
def dma_copy(dst, src, mask=None, dge_mode=None, **kwargs):
    """Copy between HBM and SBUF (either direction, or HBM->HBM) on a DMA engine."""
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
    vals = src._read(instr, "src", mask).reshape(dst.shape) if dst.shape != src.shape \
        else src._read(instr, "src", mask)
    dst._write(instr, "dst", vals, mask)
    _ops.charge_dma(instr, int(np.prod(src.shape)) * src.itemsize)
    return dst

