"""Fused attention (NKI "fused self-attention" / flash-attention tutorial pattern).

``softmax(q @ k.T * scale [+ causal mask]) @ v`` for one head, q/k/v [seq, d] with
d <= 128. Per 128-query tile the scores never leave the chip: QK^T on the Tensor
Engine into PSUM, an online (running max / running sum) softmax on the Scalar and
Vector engines, and P@V accumulated with the flash-attention rescaling.
"""

from .. import isa as nisa
from .. import jit
from .. import language as nl

_NEG = -30000.0  # "minus infinity" that stays finite in bf16/fp32 arithmetic


def _load_transposed(src, r0, r1, d):
    """[rows, d] HBM slice -> [d, rows] SBUF tile via a Tensor Engine transpose."""
    t = nl.load(src[r0:r1, :])
    return nisa.tensor_copy(nisa.nc_transpose(t), engine=nisa.engine.scalar, dtype=src.dtype)


@jit
def fused_attention(q, k, v, scale=None, causal=False):
    """Attention of ``q`` [sq, d] over ``k``/``v`` [sk, d]; returns [sq, d]."""
    sq, d = q.shape
    sk = k.shape[0]
    assert d <= nl.tile_size.pmax, "head dim must fit the 128 partitions"
    scale = (1.0 / d**0.5) if scale is None else scale
    out = nl.ndarray((sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    TQ = nl.tile_size.pmax  # queries per tile (partition dim of the scores)
    TK = nl.tile_size.pmax  # keys per step (transposed P must fit 128 partitions)
    for qi in nl.affine_range((sq + TQ - 1) // TQ):
        q0, q1 = qi * TQ, min((qi + 1) * TQ, sq)
        nq = q1 - q0
        qT = _load_transposed(q, q0, q1, d)  # [d, nq] stationary
        run_max = nl.full((nq, 1), _NEG, nl.float32, buffer=nl.sbuf)
        run_sum = nl.zeros((nq, 1), nl.float32, buffer=nl.sbuf)
        acc = nl.zeros((nq, d), nl.float32, buffer=nl.sbuf)
        n_k = (sk + TK - 1) // TK
        if causal:
            n_k = min(n_k, (q1 - 1) // TK + 1)
        for ki in nl.sequential_range(n_k):
            k0, k1 = ki * TK, min((ki + 1) * TK, sk)
            kT = _load_transposed(k, k0, k1, d)  # [d, nk] moving
            v_tile = nl.load(v[k0:k1, :])  # [nk, d]
            s = nisa.nc_matmul(qT, kT)  # raw scores [nq, nk], fp32 in PSUM
            if causal:
                i_q = q0 + nl.arange(nq)[:, None]
                i_k = k0 + nl.arange(k1 - k0)[None, :]
                s = nisa.affine_select(i_q >= i_k, s, _NEG)  # GpSimd, PSUM -> SBUF
            tile_max = nisa.tensor_reduce(nl.maximum, s, axis=1, keepdims=True)
            new_max = nl.maximum(run_max, tile_max)  # running max of raw scores
            neg_max = nisa.tensor_scalar(new_max, op0=nl.multiply, operand0=-scale)
            row_sum = nl.ndarray((nq, 1), nl.float32, buffer=nl.sbuf)
            # exp(scale * s - scale * max) with the row sum from the same Scalar instruction
            p = nisa.activation(
                op=nl.exp, data=s, scale=scale, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum, dtype=q.dtype
            )
            corr = nisa.activation(op=nl.exp, data=run_max, scale=scale, bias=neg_max)
            nisa.scalar_tensor_tensor(
                run_sum, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=row_sum, dst=run_sum
            )  # in place
            # PSUM -> SBUF evacuation on the Scalar Engine keeps the Vector Engine free
            pT = nisa.tensor_copy(nisa.nc_transpose(p), engine=nisa.engine.scalar, dtype=q.dtype)  # [nk, nq]
            pv = nisa.nc_matmul(pT, v_tile)  # [nq, d]
            nisa.scalar_tensor_tensor(acc, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=pv, dst=acc)
            run_max[...] = new_max
        inv = nisa.reciprocal(run_sum)
        nl.store(out[q0:q1, :], value=nisa.tensor_scalar(acc, op0=nl.multiply, operand0=inv, dtype=q.dtype))
    return out


def reference(q, k, v, scale=None, causal=False):
    qf, kf, vf = q.float(), k.float(), v.float()
    s = (qf @ kf.T) * (qf.shape[-1] ** -0.5 if scale is None else scale)
    if causal:  # query i sees keys 0..i (top-left aligned, as scaled_dot_product_attention)
        s = s.masked_fill(s.new_ones(s.shape).triu(1).bool(), float("-inf"))
    return (s.softmax(dim=-1) @ vf).to(q.dtype)
