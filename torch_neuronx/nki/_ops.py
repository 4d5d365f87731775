"""Shared machinery of nki.language / nki.isa instructions: operand checks,
result allocation and cost charging. Math runs in fp32 on host (as the engines do)
and results are rounded to the output dtype on write.
"""

import numpy as np

from . import _cost_model as cm
from . import _dtypes as dt
from . import _rules as rules
from ._errors import NKIShapeError, _fail
from ._simulator import current_run
from ._tensor import ON_CHIP, NkiTensor, new_storage

HBM = ("hbm", "shared_hbm", "private_hbm")
_counter = [0]


def _name(prefix):
    _counter[0] += 1
    return f"{prefix}_{_counter[0]}"


def operand(x, instr, name, mask=None, allowed=ON_CHIP):
    """Read an instruction operand: (fp32-or-int array, dtype or None, tensor or None)."""
    if isinstance(x, NkiTensor):
        rules.check_on_chip(instr, name, x, allowed)
        if x._pdim not in (0, None) and x.buffer in ON_CHIP:
            _fail(NKIShapeError, instr, name,
                  f"tile view still has {x._pdim} block dimension(s) before the partition "
                  f"dimension (shape {x.shape}); index one tile, e.g. t[i]")
        if x.buffer in ON_CHIP:
            rules.check_partition(current_run().hw, instr, name, x.shape)
        return x._read(instr, name, mask), x.dtype, x
    if isinstance(x, (int, float, bool, np.number, np.ndarray)):
        a = np.asarray(x)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        return a, None, None
    raise TypeError(f"{instr}: operand '{name}': unsupported value {type(x).__name__}")


def new_tile(values, dtype, instr, buffer="sbuf", name=None, shape=None):
    """Allocate a result tile holding ``values`` rounded to ``dtype``."""
    run = current_run()
    shape = tuple(np.shape(values)) if shape is None else tuple(shape)
    rules.check_partition(run.hw, instr, "result", shape)
    if buffer == "psum":
        rules.check_psum_tile(run.hw, instr, "result", shape, dtype)
    t = new_storage(shape, dtype, buffer, name or _name(instr.split(".")[-1]))
    if values is not None:
        t._view[...] = dt.round_to(np.broadcast_to(values, shape), dtype)
    return t


def charge_elementwise(engine, instr, shape, n_passes=1):
    run = current_run()
    p = shape[0] if len(shape) else 1
    free = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    run.ledger.charge(engine, instr,
                      n_passes * cm.elementwise_seconds(run.hw, engine, p, free))


def charge_dma(instr, nbytes):
    run = current_run()
    run.ledger.charge("DMA", instr, cm.dma_seconds(run.hw, nbytes), hbm_bytes=nbytes)


def finish(result, dst, instr, accumulate=False, mask=None):
    """Return ``result`` or, with a ``dst`` (NKI beta-2 style), write it there."""
    if dst is None:
        return result
    rules.check_on_chip(instr, "dst", dst)
    vals = result._read(instr, "result") if isinstance(result, NkiTensor) else result
    if accumulate:
        vals = dst._read(instr, "dst", mask).astype(np.float32) + vals
    dst._write(instr, "dst", vals, mask)
    return dst


def elementwise(instr, engine, fn, operands, dtype=None, mask=None, dst=None, names=None):
    """Run ``fn`` on operand arrays; allocate an SBUF result of the promoted dtype."""
    names = names or [f"x{i}" if len(operands) > 1 else "x" for i in range(len(operands))]
    arrays, dtypes = [], []
    for x, n in zip(operands, names):
        a, d, _ = operand(x, instr, n, mask)
        arrays.append(a.astype(np.float32) if a.dtype.kind == "f" else a)
        dtypes.append(d)
    try:
        shape = np.broadcast_shapes(*[a.shape for a in arrays])
    except ValueError:
        _fail(NKIShapeError, instr, names[-1],
              f"shapes {[tuple(a.shape) for a in arrays]} do not broadcast")
    with np.errstate(all="ignore"):
        values = np.asarray(fn(*arrays))
    shape = np.broadcast_shapes(shape, values.shape)
    out_dtype = dt.as_dtype(dtype) or dt.promote(*dtypes)
    charge_elementwise(engine, instr, shape)
    if mask is not None:
        values = np.where(np.broadcast_to(mask, shape), values, 0)
    res = new_tile(np.broadcast_to(values, shape), out_dtype, instr)
    return finish(res, dst, instr, mask=mask)


def assign(target, value, instr="tensor_copy", charge=True):
    """``tile[...] = value`` inside a kernel: an on-chip copy (Vector Engine)."""
    if isinstance(value, NkiTensor):
        vals, _, _ = operand(value, instr, "value")
    else:
        vals = np.asarray(value)
    if charge:
        charge_elementwise("Vector", instr, target.shape)
    target._write(instr, "dst", vals)
