"""RMSNorm (NKI "RMSNorm" tutorial): ``x * rsqrt(mean(x^2) + eps) * weight``."""

from .. import isa as nisa
from .. import jit
from .. import language as nl


@jit
def nki_rmsnorm(a_tensor, g_tensor, eps=1e-6):
    """RMSNorm of each row of ``a_tensor`` [rows, d] with weight ``g_tensor`` [d]."""
    rows, d = a_tensor.shape
    out = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    g_tile = nl.load(g_tensor.reshape((1, d)))
    g_bcast = nl.broadcast_to(g_tile, (min(pmax, rows), d))  # once, reused by every tile
    for t in nl.affine_range((rows + pmax - 1) // pmax):
        r0, r1 = t * pmax, min((t + 1) * pmax, rows)
        a_tile = nl.load(a_tensor[r0:r1, :], dtype=nl.float32)
        sq_sum = nl.ndarray((r1 - r0, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(op=nl.square, data=a_tile, reduce_op=nl.add, reduce_res=sq_sum)
        # rsqrt(sum/d + eps) on the Scalar Engine via scale and bias
        rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / d, bias=eps)
        normed = nisa.tensor_scalar(a_tile, op0=nl.multiply, operand0=rstd)
        nl.store(out[r0:r1, :], value=nl.multiply(normed, g_bcast[0 : r1 - r0, :], dtype=a_tensor.dtype))
    return out


def reference(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()).to(x.dtype)
