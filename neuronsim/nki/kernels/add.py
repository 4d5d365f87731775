"""Elementwise add (NKI "getting started" tutorial), tiled over 128 partitions with a
mask for the ragged last tile."""

from .. import jit
from .. import language as nl


@jit
def nki_tensor_add(a_input, b_input):
    """``a_input + b_input`` for 2-D tensors of any shape (rows tiled by 128)."""
    out = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    rows, cols = a_input.shape
    pmax = nl.tile_size.pmax
    i_f = nl.arange(cols)[None, :]
    for t in nl.affine_range((rows + pmax - 1) // pmax):
        i_p = t * pmax + nl.arange(pmax)[:, None]
        in_bounds = i_p < rows
        a_tile = nl.load(a_input[i_p, i_f], mask=in_bounds)
        b_tile = nl.load(b_input[i_p, i_f], mask=in_bounds)
        nl.store(out[i_p, i_f], value=nl.add(a_tile, b_tile), mask=in_bounds)
    return out


def reference(a, b):
    return a + b
