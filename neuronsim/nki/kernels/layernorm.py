"""LayerNorm (NKI "LayerNorm" tutorial, bn_stats/bn_aggr version)."""

from .. import isa as nisa
from .. import jit
from .. import language as nl


@jit
def nki_layernorm(x, gamma, beta, eps=1e-5):
    """LayerNorm over the last dim of ``x`` [rows, d] with affine ``gamma``/``beta`` [d]."""
    rows, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    fmax = nl.tile_size.bn_stats_fmax  # 512
    n_chunks = (d + fmax - 1) // fmax
    g_tile = nl.load(gamma.reshape((1, d)))
    b_tile = nl.load(beta.reshape((1, d)))
    g_bcast = nl.broadcast_to(g_tile, (min(pmax, rows), d))  # once, reused by every tile
    b_bcast = nl.broadcast_to(b_tile, (min(pmax, rows), d))
    for t in nl.affine_range((rows + pmax - 1) // pmax):
        r0, r1 = t * pmax, min((t + 1) * pmax, rows)
        p = r1 - r0
        x_tile = nl.load(x[r0:r1, :], dtype=nl.float32)
        stats = nl.ndarray((p, 6 * n_chunks), nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(n_chunks):
            c0, c1 = c * fmax, min((c + 1) * fmax, d)
            stats[:, 6 * c : 6 * (c + 1)] = nisa.bn_stats(x_tile[:, c0:c1])
        mean_var = nisa.bn_aggr(stats)
        rstd = nisa.activation(op=nl.rsqrt, data=mean_var[:, 1:2], bias=eps)
        normed = nisa.tensor_scalar(x_tile, op0=nl.subtract, operand0=mean_var[:, 0:1], op1=nl.multiply, operand1=rstd)
        y = nl.add(nl.multiply(normed, g_bcast[0:p, :]), b_bcast[0:p, :], dtype=x.dtype)
        nl.store(out[r0:r1, :], value=y)
    return out


def reference(x, gamma, beta, eps=1e-5):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = xf.var(-1, correction=0, keepdim=True)  # biased, as layer norm uses
    return ((xf - mean) * (var + eps).rsqrt() * gamma.float() + beta.float()).to(x.dtype)
