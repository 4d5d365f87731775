"""Tensors of the simulated NeuronCore: HBM tensors and SBUF/PSUM tiles.

An :class:`NkiTensor` is a view (basic slicing, or NKI advanced indexing with
``nl.arange`` / ``nl.mgrid`` index arrays) of a storage that lives in one buffer.
Accesses are bounds-checked when an instruction reads or writes them, so the error
names that instruction and operand.
"""

import numpy as np

from . import _dtypes as dt
from ._errors import NKIBufferError, NKIIndexError, NKIShapeError, _fail

BUFFERS = ("hbm", "shared_hbm", "private_hbm", "sbuf", "psum")
ON_CHIP = ("sbuf", "psum")


class par_dim(int):
    """Marks the partition dimension in a shape: ``(n, nl.par_dim(128), 512)``."""


class _Storage:
    __slots__ = ("data", "buffer", "dtype", "name", "pdim", "written", "__weakref__")

    def __init__(self, data, buffer, dtype, name, pdim):
        self.data = data
        self.buffer = buffer
        self.dtype = dtype
        self.name = name
        self.pdim = pdim
        self.written = False


def _is_index_array(k):
    return isinstance(k, np.ndarray) and k.dtype != np.bool_ and k.ndim > 0


def _desc(k):
    if isinstance(k, slice):
        return f"{k.start}:{k.stop}" + (f":{k.step}" if k.step not in (None, 1) else "")
    return str(k)


class NkiTensor:
    """A tensor or tile in HBM, SBUF or PSUM (``nl.ndarray`` / ``nl.load`` results)."""

    __array_priority__ = 1000  # make numpy scalars defer to our operators

    def __init__(self, storage, view, pdim, adv=None, oob=None, shape=None):
        self._storage = storage
        self._view = view  # NumPy view of storage.data (basic indexing applied)
        self._pdim = pdim  # partition axis of this view (None: partition indexed away)
        self._adv = adv  # broadcast tuple of index arrays applied on top of _view
        self._oob = oob  # deferred out-of-bounds description (dim, index, size)
        if shape is not None:
            self._shape = tuple(shape)
        elif adv is not None:
            self._shape = tuple(np.broadcast_shapes(*[a.shape for a in adv]))
        else:
            self._shape = tuple(view.shape)

    # ----- metadata -------------------------------------------------------------
    @property
    def shape(self):
        return self._shape

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def dtype(self):
        return self._storage.dtype

    @property
    def buffer(self):
        return self._storage.buffer

    @property
    def name(self):
        return self._storage.name

    @property
    def itemsize(self):
        return self.dtype.itemsize

    def __repr__(self):
        return f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype!r}, " \
               f"buffer={self.buffer})"

    def __len__(self):
        return self._shape[0]

    def __iter__(self):
        raise TypeError("NKI tensors are not iterable; index them with slices or nl.arange")

    def __bool__(self):
        raise TypeError("the truth value of an NKI tile is data dependent; "
                        "use nl.where / masks instead of Python control flow")

    # ----- indexing -------------------------------------------------------------
    def __getitem__(self, key):
        if self._adv is not None or self._oob is not None:
            raise NKIShapeError(f"indexing an already index-array/out-of-bounds view of "
                                f"'{self.name}' is not supported; index the tensor once")
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        key = tuple(np.asarray(k) if isinstance(k, (list,)) else k for k in key)
        if len(key) > self.ndim:
            raise NKIIndexError(f"too many indices ({len(key)}) for tensor '{self.name}' of "
                                f"shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - len(key))
        if any(_is_index_array(k) for k in key):
            return self._advanced(key)
        basic, shape, oob, pdim = [], [], None, None
        for d, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, slice):
                start, stop, step = k.start, k.stop, k.step
                step = 1 if step is None else int(step)
                start = 0 if start is None else int(start)
                stop = n if stop is None else int(stop)
                if step <= 0 or start < 0 or stop < start:
                    raise NKIIndexError(f"slice {_desc(k)} of tensor '{self.name}' dim {d}: "
                                        f"only non-negative increasing slices are supported")
                if stop > n and oob is None:
                    oob = (d, _desc(k), n)
                basic.append(slice(start, min(stop, n), step))
                shape.append(len(range(start, stop, step)))
                if d == self._pdim:
                    pdim = len(shape) - 1
            else:
                try:
                    k = int(k)
                except TypeError:
                    raise NKIIndexError(f"unsupported index {k!r} for tensor '{self.name}'")
                if (k < 0 or k >= n) and oob is None:
                    oob = (d, str(k), n)
                basic.append(min(max(k, 0), n - 1))
        view = self._view[tuple(basic)]
        return NkiTensor(self._storage, view, pdim, oob=oob, shape=shape)

    def _advanced(self, key):
        arrays = [k for k in key if _is_index_array(k)]
        rank = max(a.ndim for a in arrays)
        full = []
        for d, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, slice):
                if d >= rank:
                    raise NKIIndexError(f"cannot mix slice at dim {d} with {rank}-D index "
                                        f"arrays for tensor '{self.name}'")
                r = np.arange(k.start or 0, n if k.stop is None else k.stop, k.step or 1)
                shp = [1] * rank
                shp[d] = r.size
                full.append(r.reshape(shp))
            elif _is_index_array(k):
                full.append(k.astype(np.int64))
            else:
                full.append(np.asarray(int(k), dtype=np.int64))
        adv = tuple(np.broadcast_arrays(*full))
        pdim = 0 if self.buffer in ON_CHIP else None
        return NkiTensor(self._storage, self._view, pdim, adv=adv)

    def __setitem__(self, key, value):
        target = self[key]
        if isinstance(value, NkiTensor) and value._storage is target._storage and \
                value._view is not None and target._view is not None and \
                value._adv is None and target._adv is None and \
                value._view.__array_interface__ == target._view.__array_interface__:
            return  # `t[k] += x` already wrote in place through __iadd__
        if target.buffer not in ON_CHIP:
            _fail(NKIBufferError, "tensor assignment", target.name,
                  f"cannot assign into a {target.buffer.upper()} tensor from a kernel "
                  f"expression; use nl.store(dst, value) or nisa.dma_copy")
        from . import _ops
        _ops.assign(target, value)

    # ----- data access used by instructions -----------------------------------
    def _check_oob(self, instr, operand, mask):
        if self._oob is not None:
            d, idx, n = self._oob
            _fail(NKIIndexError, instr, operand,
                  f"index {idx} out of bounds for dim {d} of size {n} of tensor "
                  f"'{self.name}' shape {self._storage.data.shape}")
        if self._adv is not None:
            live = np.ones(self.shape, bool) if mask is None else np.broadcast_to(mask, self.shape)
            for d, (a, n) in enumerate(zip(self._adv, self._view.shape)):
                bad = live & ((a < 0) | (a >= n))
                if bad.any():
                    vals = np.unique(a[bad])
                    _fail(NKIIndexError, instr, operand,
                          f"index {int(vals[0])} out of bounds for dim {d} of size {n} of "
                          f"tensor '{self.name}' (add a mask to the access)")

    def _read(self, instr, operand, mask=None):
        """Values of this view as a NumPy array (dtype-rounded host storage)."""
        self._check_oob(instr, operand, mask)
        if self._adv is None:
            return self._view
        if mask is None:
            return self._view[self._adv]
        m = np.broadcast_to(mask, self.shape)
        out = np.zeros(self.shape, self._view.dtype)
        out[m] = self._view[tuple(a[m] for a in self._adv)]
        return out

    def _write(self, instr, operand, values, mask=None):
        """Store ``values`` (broadcast to this view's shape) rounded to the dtype."""
        self._check_oob(instr, operand, mask)
        values = np.asarray(values)
        try:
            values = np.broadcast_to(values, self.shape)
        except ValueError:
            _fail(NKIShapeError, instr, operand,
                  f"value of shape {values.shape} does not fit destination "
                  f"'{self.name}' view of shape {self.shape}")
        values = dt.round_to(values, self.dtype)
        self._storage.written = True
        if self._adv is None:
            if mask is None:
                self._view[...] = values
            else:
                m = np.broadcast_to(mask, self.shape)
                self._view[m] = values[m]
        else:
            if mask is None:
                self._view[self._adv] = values
            else:
                m = np.broadcast_to(mask, self.shape)
                self._view[tuple(a[m] for a in self._adv)] = values[m]

    @property
    def _partition_size(self):
        return 1 if self._pdim is None or not self.shape else self.shape[self._pdim]

    @property
    def _free_size(self):
        n = 1
        for i, s in enumerate(self.shape):
            if i != self._pdim:
                n *= s
        return n

    @property
    def _nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    # ----- operators map to nki.language elementwise ops (Vector Engine) --------
    def _binop(name, reverse=False):
        def op(self, other):
            from . import language as nl
            f = getattr(nl, name)
            return f(other, self) if reverse else f(self, other)
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
    __lt__ = _binop("less")
    __le__ = _binop("less_equal")
    __gt__ = _binop("greater")
    __ge__ = _binop("greater_equal")
    __and__ = _binop("logical_and")
    __or__ = _binop("logical_or")
    __xor__ = _binop("logical_xor")
    __matmul__ = _binop("matmul")
    del _binop

    def __neg__(self):
        from . import language as nl
        return nl.negative(self)

    def __abs__(self):
        from . import language as nl
        return nl.abs(self)

    def _inplace(name):
        def op(self, other):
            from . import _ops
            from . import language as nl
            if name == "add" and self.buffer == "psum" and isinstance(other, NkiTensor) \
                    and other.buffer == "psum":
                # PSUM accumulation happens as the Tensor Engine writes: no engine time
                acc = self._read("psum accumulate", "dst").astype(np.float32)
                self._write("psum accumulate", "dst",
                            acc + other._read("psum accumulate", "value"))
                return self
            result = getattr(nl, name)(self, other)
            _ops.assign(self, result, instr=f"nl.{name} (in place)", charge=False)
            return self
        return op

    __iadd__ = _inplace("add")
    __isub__ = _inplace("subtract")
    __imul__ = _inplace("multiply")
    __itruediv__ = _inplace("divide")
    del _inplace

    __hash__ = object.__hash__

    def __eq__(self, other):
        from . import language as nl
        return nl.equal(self, other)

    def __ne__(self, other):
        from . import language as nl
        return nl.not_equal(self, other)

    # convenience methods mirroring NKI tile methods
    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if self._adv is not None or self._oob is not None or not self._view.flags.c_contiguous:
            raise NKIShapeError(f"reshape of tensor '{self.name}' needs a contiguous view")
        view = self._view.reshape(shape)
        return NkiTensor(self._storage, view, 0 if self.buffer in ON_CHIP else None)

    def view(self, dtype):
        raise NotImplementedError("bit-cast views are not simulated")


def new_storage(shape, dtype, buffer, name, fill=None):
    """Allocate a tensor (accounted by the running kernel when on-chip)."""
    from ._simulator import current_run
    if buffer not in BUFFERS:
        raise ValueError(f"unknown buffer {buffer!r}; expected nl.hbm/nl.shared_hbm/"
                         f"nl.private_hbm/nl.sbuf/nl.psum")
    dtype = dt.as_dtype(dtype) or dt.float32
    shape = tuple(shape)
    pdim = 0
    for i, s in enumerate(shape):
        if isinstance(s, par_dim):
            pdim = i
    shape = tuple(int(s) for s in shape)
    data = np.zeros(shape, dtype.np_storage)
    if fill is not None:
        data[...] = dt.round_to(np.asarray(fill), dtype)
    st = _Storage(data, buffer, dtype, name, pdim)
    run = current_run(required=False)
    if run is not None and buffer in ON_CHIP:
        run.allocate(st, shape, dtype, pdim)
    t = NkiTensor(st, data, pdim if buffer in ON_CHIP else None)
    return t


def from_array(array, dtype, buffer, name):
    """Wrap an existing host array (a kernel argument) as an HBM tensor."""
    st = _Storage(array, buffer, dtype, name, 0)
    return NkiTensor(st, array, None)

