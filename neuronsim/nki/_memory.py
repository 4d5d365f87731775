"""Byte-addressed on-chip memory shared by tensors (NumPy only).

Most tensors live only in their host arrays. A tensor placed by direct allocation
(``nki.compiler.sbuf/psum.alloc``) or reinterpreted by a bit-cast view
(``NkiTensor.view``) also has a :class:`Placement` in a :class:`Memory`: its host array
is then a cache of those bytes, refreshed before each read and written back after each
write, so tensors at the same addresses see each other's writes, bit for bit.
"""

import numpy as np

from . import _dtypes as dt


class Memory:
    """Byte-addressed memory: ``rows`` partitions (one row for HBM) of ``nbytes`` bytes,
    and which bytes were ever written. Tensors placed in it alias the same bytes."""

    def __init__(self, rows, nbytes):
        self.bytes = np.zeros((rows, nbytes), np.uint8)
        self.init = np.zeros((rows, nbytes), bool)


class Placement:
    """Where a storage's elements live in a :class:`Memory`: its data is ``blocks`` tiles of
    ``partitions x free`` elements; tile ``b`` starts at partition ``rows[b]``, byte
    ``cols[b]``, and partition ``p`` of it holds ``free`` elements of ``itemsize`` bytes."""

    __slots__ = ("memory", "rows", "cols", "tile", "free", "itemsize")

    def __init__(self, memory, rows, cols, tile, free, itemsize):
        self.memory = memory
        self.rows = np.asarray(rows, np.int64)
        self.cols = np.asarray(cols, np.int64)
        self.tile = tile
        self.free = free
        self.itemsize = itemsize

    def locate(self, offs):
        """(partition, first byte) of storage elements ``offs`` (row-major numbers)."""
        b, w = np.divmod(offs, self.tile)
        p, f = np.divmod(w, self.free)
        return (self.rows[b] + p)[:, None], (self.cols[b] + f * self.itemsize)[:, None] + np.arange(self.itemsize)


def pull(st, offs):
    """Refresh cached elements ``offs`` of ``st`` from the bytes they live in."""
    if offs.size == 0:
        return
    pl = st.placement
    r, c = pl.locate(offs)
    raw = np.ascontiguousarray(pl.memory.bytes[r, c])
    st.data.reshape(-1)[offs] = dt.from_bits(raw.view(dt._UINT[pl.itemsize]).ravel(), st.dtype)
    if st.share_init and st.init is not None:
        st.init.reshape(-1)[offs] = pl.memory.init[r, c].all(axis=1)


def push(st, offs, init=None):
    """Write cached elements ``offs`` of ``st`` to the bytes they live in."""
    if offs.size == 0:
        return
    pl = st.placement
    r, c = pl.locate(offs)
    bits = dt.to_bits(st.data.reshape(-1)[offs], st.dtype)
    pl.memory.bytes[r, c] = bits.view(np.uint8).reshape(-1, pl.itemsize)
    pl.memory.init[r, c] = True if init is None else init[:, None]
