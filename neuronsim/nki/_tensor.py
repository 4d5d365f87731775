"""Storage and views of the simulated NeuronCore memories (HBM, SBUF, PSUM).

A :class:`TensorView` is a view (basic slicing, or NKI advanced indexing with
``nl.arange`` / ``nl.mgrid`` index arrays) of a storage that lives in one buffer.
Accesses are bounds-checked when an instruction reads or writes them, so the error
names that instruction and operand. On-chip memory and ``nl.ndarray`` outputs start
uninitialised (NaN-filled, and tracked): reading an element no instruction wrote
raises :class:`NKIUninitializedError` instead of silently returning a value.
The arithmetic operators live on the ``NkiTensor`` subclass in ``_ops``.
"""

import numpy as np

from . import _dtypes as dt
from ._context import current_run
from ._errors import NKIIndexError, NKIShapeError, NKIUninitializedError, _fail
from ._memory import Memory, Placement
from ._memory import pull as _pull
from ._memory import push as _push

BUFFERS = ("hbm", "shared_hbm", "private_hbm", "sbuf", "psum")
ON_CHIP = ("sbuf", "psum")


class par_dim(int):
    """Marks the partition dimension in a shape: ``(n, nl.par_dim(128), 512)``."""


class _Storage:
    __slots__ = (
        "data",
        "init",
        "buffer",
        "dtype",
        "name",
        "pdim",
        "written",
        "psum_key",
        "placement",
        "share_init",
        "base",
        "__weakref__",
    )

    def __init__(self, data, buffer, dtype, name, pdim, init=None):
        self.data = data
        self.init = init  # bool array: element written yet (None: all initialised)
        self.buffer = buffer
        self.dtype = dtype
        self.name = name
        self.pdim = pdim
        self.written = False
        self.psum_key = None  # set for an automatically placed PSUM tensor: its liveness record
        # set when the tensor's bytes live in a byte-addressed memory that other tensors may
        # share (manual allocation, bit-cast views): data/init then cache those bytes
        self.placement = None
        self.share_init = False  # init flags follow the shared bytes (else: this tensor's writes)
        self.base = None  # the storage a bit-cast view reinterprets (kept alive with it)


def _tile_geometry(st):
    """(blocks, partitions, free elements per partition) of a storage's data."""
    shape = st.data.shape
    if st.buffer not in ON_CHIP or not shape:
        return 1, 1, max(int(st.data.size), 1)
    k = st.pdim
    return (
        int(np.prod(shape[:k], dtype=np.int64)),
        int(shape[k]),
        int(np.prod(shape[k + 1 :], dtype=np.int64)),
    )


def _give_memory(st):
    """Move a storage that lives only in its cache into a private byte memory (so that
    bit-cast views of it can share its bytes)."""
    if st.placement is not None:
        return
    if not st.data.flags.c_contiguous:
        raise NotImplementedError(
            f"bit-cast view of tensor '{st.name}': its host array is not contiguous; pass a contiguous array"
        )
    blocks, parts, free = _tile_geometry(st)
    size = st.dtype.itemsize
    mem = Memory(parts, blocks * free * size)
    st.placement = Placement(mem, np.zeros(blocks), np.arange(blocks) * free * size, parts * free, free, size)
    offs = np.arange(st.data.size)
    init = None if st.init is None else st.init.reshape(-1)
    _push(st, offs, init)
    st.share_init = True


def _is_index_array(k):
    return isinstance(k, np.ndarray) and k.dtype != np.bool_ and k.ndim > 0


def _desc(k):
    if isinstance(k, slice):
        return f"{k.start}:{k.stop}" + (f":{k.step}" if k.step not in (None, 1) else "")
    return str(k)


def align(values, shape):
    """Broadcast ``values`` to ``shape`` the NKI way: tiles align at the partition axis
    (axis 0), so a [P] vector acts as [P, 1]; NumPy's trailing rule otherwise."""
    values = np.asarray(values)
    if 0 < values.ndim < len(shape) and values.shape[0] == shape[0] and shape[0] > 1:
        values = values.reshape(values.shape + (1,) * (len(shape) - values.ndim))
    return np.broadcast_to(values, shape)


class TensorView:
    """A tensor or tile in HBM, SBUF or PSUM (``nl.ndarray`` / ``nl.load`` results)."""

    __array_priority__ = 1000  # make numpy scalars defer to our operators

    def __init__(self, storage, view, pdim, adv=None, oob=None, shape=None, init=None):
        self._storage = storage
        self._view = view  # NumPy view of storage.data (basic indexing applied)
        self._init = init  # the same view of storage.init (None: all initialised)
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
        return f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype!r}, " f"buffer={self.buffer})"

    def __len__(self):
        return self._shape[0]

    def __iter__(self):
        raise TypeError("NKI tensors are not iterable; index them with slices or nl.arange")

    def __bool__(self):
        raise TypeError(
            "the truth value of an NKI tile is data dependent; " "use nl.where / masks instead of Python control flow"
        )

    def _new_view(self, view, pdim, **kw):
        return type(self)(self._storage, view, pdim, **kw)

    # ----- indexing -------------------------------------------------------------
    def __getitem__(self, key):
        if self._adv is not None or self._oob is not None:
            raise NKIShapeError(
                f"indexing an already index-array/out-of-bounds view of "
                f"'{self.name}' is not supported; index the tensor once"
            )
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1 :]
        # lists, and tiles holding indices (indirect DMA: `t[idx_tile[i_p, 0], i_f]`),
        # become index arrays; the simulator reads tile values eagerly
        key = tuple(
            np.asarray(k)
            if isinstance(k, list)
            else np.asarray(k._read("indirect index", "index")).astype(np.int64)
            if isinstance(k, TensorView)
            else k
            for k in key
        )
        if len(key) > self.ndim:
            raise NKIIndexError(f"too many indices ({len(key)}) for tensor '{self.name}' of " f"shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - len(key))
        if any(_is_index_array(k) for k in key):
            return self._advanced(key)
        basic, shape, oob, pdim = [], [], None, None
        int_free = False
        for d, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, slice):
                start, stop, step = k.start, k.stop, k.step
                step = 1 if step is None else int(step)
                start = 0 if start is None else int(start)
                stop = n if stop is None else int(stop)
                if step <= 0 or start < 0 or stop < start:
                    raise NKIIndexError(
                        f"slice {_desc(k)} of tensor '{self.name}' dim {d}: "
                        f"only non-negative increasing slices are supported"
                    )
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
                    raise NKIIndexError(f"unsupported index {k!r} for tensor '{self.name}'") from None
                if (k < 0 or k >= n) and oob is None:
                    oob = (d, str(k), n)
                if self._pdim is not None and d > self._pdim and self.buffer in ON_CHIP:
                    int_free = True
                basic.append(min(max(k, 0), n - 1))
        view = self._view[tuple(basic)]
        init = None if self._init is None else self._init[tuple(basic)]
        if int_free and pdim is not None and len(shape) == pdim + 1:
            # An integer free index of an on-chip tile leaves a [P, 1] operand: the
            # partition axis never stands alone.
            view, shape = view[..., None], shape + [1]
            init = None if init is None else init[..., None]
        return self._new_view(view, pdim, oob=oob, shape=shape, init=init)

    def _advanced(self, key):
        arrays = [k for k in key if _is_index_array(k)]
        rank = max(a.ndim for a in arrays)
        full = []
        for d, (k, n) in enumerate(zip(key, self.shape)):
            if isinstance(k, slice):
                if d >= rank:
                    raise NKIIndexError(
                        f"cannot mix slice at dim {d} with {rank}-D index " f"arrays for tensor '{self.name}'"
                    )
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
        return self._new_view(self._view, pdim, adv=adv, init=self._init)

    # ----- data access used by instructions -----------------------------------
    def _check_oob(self, instr, operand, mask):
        if self._oob is not None:
            d, idx, n = self._oob
            _fail(
                NKIIndexError,
                instr,
                operand,
                f"index {idx} out of bounds for dim {d} of size {n} of tensor "
                f"'{self.name}' shape {self._storage.data.shape}",
            )
        if self._adv is not None:
            live = np.ones(self.shape, bool) if mask is None else np.broadcast_to(mask, self.shape)
            for d, (a, n) in enumerate(zip(self._adv, self._view.shape)):
                bad = live & ((a < 0) | (a >= n))
                if bad.any():
                    vals = np.unique(a[bad])
                    _fail(
                        NKIIndexError,
                        instr,
                        operand,
                        f"index {int(vals[0])} out of bounds for dim {d} of size {n} of "
                        f"tensor '{self.name}' (add a mask to the access)",
                    )

    def _offsets(self, mask=None):
        """Row-major element numbers (in the storage) of this view's elements."""
        data = self._storage.data
        h = data.itemsize
        base = (self._view.__array_interface__["data"][0] - data.__array_interface__["data"][0]) // h
        strides = [st // h for st in self._view.strides]
        if self._adv is None:
            offs = np.full((), base, np.int64)
            for n, st in zip(self._view.shape, strides):
                offs = offs[..., None] + np.arange(n, dtype=np.int64) * st
            offs = offs.reshape(self.shape) if offs.size == int(np.prod(self.shape)) else offs
        else:
            offs = base + sum(a.astype(np.int64) * st for a, st in zip(self._adv, strides))
        if mask is not None:
            offs = offs[np.broadcast_to(np.asarray(mask, bool), offs.shape)]
        return offs.reshape(-1)

    def _sync_all(self):
        """Refresh the whole storage from its bytes (before the host reads it directly)."""
        st = self._storage
        if st.placement is not None:
            _pull(st, np.arange(st.data.size))

    def _sync_in(self, mask=None):
        if self._storage.placement is not None and self._view.size:
            _pull(self._storage, self._offsets(mask))

    def _initialised(self, mask=None):
        """Bool array (this view's shape): which elements have been written."""
        if self._storage.share_init:
            self._sync_in(mask)
        if self._init is None:
            return np.ones(self.shape, bool)
        if self._adv is None:
            return self._init
        if mask is None:
            return self._init[self._adv]
        m = np.broadcast_to(mask, self.shape)
        out = np.ones(self.shape, bool)
        out[m] = self._init[tuple(a[m] for a in self._adv)]
        return out

    def _check_init(self, instr, operand, mask):
        if self._init is None:
            return
        ok = self._initialised(mask)
        if mask is not None:
            ok = ok | ~np.broadcast_to(np.asarray(mask, bool), self.shape)
        if not ok.all():
            first = tuple(int(i) for i in np.argwhere(~ok)[0])
            _fail(
                NKIUninitializedError,
                instr,
                operand,
                f"reads {int((~ok).sum())} uninitialised element(s) of '{self.name}' "
                f"({self.buffer.upper()}, first at view index {first}); write them first "
                f"(nl.load, nisa.memset, nl.zeros, an instruction's dst) or mask the access",
            )

    def _touch_blocks(self, write):
        """Tell the run which blocks of a PSUM block tensor this access spans."""
        st = self._storage
        run = current_run(required=False)
        if run is None or self._view.size == 0:
            return
        base = self._view.__array_interface__["data"][0] - st.data.__array_interface__["data"][0]
        strides = self._view.strides
        if self._adv is None:
            lo = base
            hi = base + sum((n - 1) * s for n, s in zip(self._view.shape, strides))
        else:
            lo = base + sum(int(a.min()) * s for a, s in zip(self._adv, strides))
            hi = base + sum(int(a.max()) * s for a, s in zip(self._adv, strides))
        if st.pdim == 0:  # a plain tile: one block
            lo, hi, block_bytes = 0, 0, 1
        else:
            block_bytes = st.data.strides[st.pdim - 1]
        run.touch_psum_blocks(st.psum_key, lo // block_bytes, hi // block_bytes, write)

    def _read(self, instr, operand, mask=None):
        """Values of this view as a NumPy array (dtype-rounded host storage)."""
        self._check_oob(instr, operand, mask)
        self._sync_in(mask)
        self._check_init(instr, operand, mask)
        if self._storage.psum_key is not None:
            self._touch_blocks(write=False)
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
        if (
            values.size == int(np.prod(self.shape))
            and values.shape != self.shape
            and _squeeze(values.shape) == _squeeze(self.shape)
        ):
            values = values.reshape(self.shape)  # [P, 1] <-> [P] style unit axes
        try:
            values = align(values, self.shape)
        except ValueError:
            _fail(
                NKIShapeError,
                instr,
                operand,
                f"value of shape {values.shape} does not fit destination " f"'{self.name}' view of shape {self.shape}",
            )
        values = dt.round_to(values, self.dtype)
        self._storage.written = True
        if self._storage.base is not None:
            self._storage.base.written = True
        if self._storage.psum_key is not None:
            self._touch_blocks(write=True)
        m = None if mask is None else np.broadcast_to(np.asarray(mask, bool), self.shape)
        if self._adv is None:
            if m is None:
                self._view[...] = values
                if self._init is not None:
                    self._init[...] = True
            else:
                self._view[m] = values[m]
                if self._init is not None:
                    self._init[m] = True
        else:
            idx = self._adv if m is None else tuple(a[m] for a in self._adv)
            self._view[idx] = values if m is None else values[m]
            if self._init is not None:
                self._init[idx] = True
        if self._storage.placement is not None and self._view.size:
            _push(self._storage, self._offsets(m))

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

    __hash__ = object.__hash__

    def reshape(self, *shape):
        """A view of the same elements with a new shape (contiguous views only)."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if self._adv is not None or self._oob is not None or not self._view.flags.c_contiguous:
            raise NKIShapeError(f"reshape of tensor '{self.name}' needs a contiguous view")
        view = self._view.reshape(shape)
        init = None if self._init is None else self._init.reshape(shape)
        return self._new_view(view, 0 if self.buffer in ON_CHIP else None, init=init)

    def view(self, dtype):
        """Reinterpret this view's bytes as ``dtype`` (no copy, like ``numpy.ndarray.view``):
        the last dimension scales by the ratio of the element sizes. Writes through either
        tensor are seen by the other."""
        new = dt.as_dtype(dtype)
        where = f"tensor '{self.name}'.view({new!r})"
        if self._adv is not None or self._oob is not None:
            raise NKIShapeError(f"{where}: needs a view made of slices, not index arrays")
        st = self._storage
        old, h = st.dtype, st.data.itemsize
        if new is old:
            return self
        shape = list(self.shape)
        last = len(shape) - 1
        if last < 0 or (self.buffer in ON_CHIP and self._pdim == last):
            raise NKIShapeError(f"{where}: needs a free (last) dimension to rescale; shape {self.shape}")
        if shape[last] * old.itemsize % new.itemsize:
            raise NKIShapeError(
                f"{where}: last dimension {shape[last]} x {old.itemsize} bytes is not a multiple of "
                f"{new.itemsize} bytes"
            )
        if self._view.shape != tuple(shape) or (shape[last] > 1 and self._view.strides[last] != h):
            raise NKIShapeError(f"{where}: the last dimension must be contiguous in memory")
        if st.data.shape[-1] * old.itemsize % new.itemsize:
            raise NKIShapeError(
                f"{where}: rows of '{self.name}' ({st.data.shape[-1]} x {old.itemsize} bytes) do not "
                f"hold whole {new!r} elements"
            )
        first = self._first_element()
        if first * old.itemsize % new.itemsize:
            raise NKIShapeError(f"{where}: the view does not start on a {new.itemsize}-byte boundary")
        _give_memory(st)
        blocks, parts, free = _tile_geometry(st)
        pl = st.placement
        if free * old.itemsize % new.itemsize:
            raise NKIShapeError(f"{where}: partitions of '{self.name}' do not hold whole {new!r} elements")
        nfree = free * old.itemsize // new.itemsize
        nshape = st.data.shape[:-1] + (st.data.shape[-1] * old.itemsize // new.itemsize,)
        twin = make_storage(nshape, new, st.buffer, f"{st.name}.view({new.name})", initialised=False)
        twin.pdim = st.pdim
        twin.psum_key = st.psum_key
        twin.placement = Placement(pl.memory, pl.rows, pl.cols, parts * nfree, nfree, new.itemsize)
        twin.share_init = True
        twin.base = st
        h2 = twin.data.itemsize
        scale = old.itemsize / new.itemsize  # elements of the new type per old element
        strides = [int(s // h * scale) * h2 for s in self._view.strides[:last]] + [h2]
        shape[last] = shape[last] * old.itemsize // new.itemsize
        start = int(first * scale)
        flat = twin.data.reshape(-1)[start:]
        view = np.lib.stride_tricks.as_strided(flat, shape, strides)
        init = np.lib.stride_tricks.as_strided(twin.init.reshape(-1)[start:], shape, [s // h2 for s in strides])
        return type(self)(twin, view, self._pdim, init=init)

    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """A hardware access pattern over this tensor: ``pattern`` is ``[[step, num], ...]``
        (the first pair walks partitions); element ``(i0, i1, ...)`` is the tensor's element
        number ``offset + sum(i_k * step_k)`` counted row-major from the start of this view.
        """
        where = f"tensor '{self.name}'.ap"
        for arg, value in (("scalar_offset", scalar_offset), ("vector_offset", vector_offset), ("dtype", dtype)):
            if value is not None:
                raise NotImplementedError(
                    f"{where}: {arg}= (dynamic/indirect offsets and bit-cast access patterns) is not simulated"
                )
        del indirect_dim  # only meaningful with scalar_offset / vector_offset
        try:
            pairs = [(int(step), int(num)) for step, num in pattern]
        except (TypeError, ValueError):
            raise NKIShapeError(f"{where}: pattern must be a list of [step, num] pairs, got {pattern!r}") from None
        if not pairs or any(num < 1 for _, num in pairs):
            raise NKIShapeError(f"{where}: pattern {pattern!r} needs at least one [step, num] pair with num >= 1")
        data = self._storage.data
        if self._adv is not None or self._oob is not None or (self.buffer in ON_CHIP and self._storage.pdim != 0):
            raise NotImplementedError(
                f"{where}: access patterns over an index-array view or a block tensor (partition "
                f"axis not first) are not simulated; apply .ap() to the tensor itself"
            )
        base = self._first_element()
        flat = np.full((), base + int(offset), np.int64)
        for k, (step, num) in enumerate(pairs):
            shape = [1] * len(pairs)
            shape[k] = num
            flat = flat + (np.arange(num, dtype=np.int64) * step).reshape(shape)
        if self.buffer in ON_CHIP and data.ndim > 1:
            row = data.size // data.shape[0]
            start = base + int(offset)
            free = start % row + (flat[0:1] - start)  # the free-axis terms of partition 0
            p_step = pairs[0][0]
            if (pairs[0][1] > 1 and p_step % row) or free.min() < 0 or free.max() >= row:
                raise NKIShapeError(
                    f"{where}: on-chip pattern {pattern!r} must step whole partitions ({row} elements) "
                    f"with its first pair and stay inside a partition with the others"
                )
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= data.size:
            raise NKIIndexError(
                f"{where}: pattern {pattern!r} with offset {offset} reaches element {lo if lo < 0 else hi} "
                f"of a tensor of {data.size} elements"
            )
        adv = tuple(np.unravel_index(flat, data.shape))
        pdim = 0 if self.buffer in ON_CHIP else None
        return self._new_view(data, pdim, adv=adv, init=self._storage.init)

    def _first_element(self):
        """Row-major element number of this view's first element within its storage."""
        data, view = self._storage.data, self._view
        if view.size == 0:
            return 0
        delta = view.__array_interface__["data"][0] - data.__array_interface__["data"][0]
        if delta == 0:
            return 0
        if not data.flags.c_contiguous:
            raise NotImplementedError(
                f"tensor '{self.name}'.ap on a slice of a non-contiguous kernel argument is not "
                f"simulated; pass a contiguous array or apply .ap() to the whole tensor"
            )
        return delta // data.itemsize


def _squeeze(shape):
    return tuple(s for s in shape if s != 1)


def make_storage(shape, dtype, buffer, name, initialised):
    """Host arrays of a new tensor: floats NaN-filled and tracked until written."""
    data = np.zeros(shape, dtype.np_storage)
    init = None
    if not initialised:
        if dtype.is_float:
            data.fill(np.nan)
        init = np.zeros(shape, bool)
    pdim = 0
    return _Storage(data, buffer, dtype, name, pdim, init)
