"""Tiled matmul (NKI "matrix multiplication" tutorial): ``lhsT.T @ rhs``.

The Tensor Engine contracts over the partition dimension, so the left operand is
passed transposed ([K, M]) and used as the stationary tile (M <= 128), the right
operand streams as the moving tile (N <= 512), and K is accumulated in PSUM in
128-row steps. Edge tiles are smaller (shapes are static at trace time).
"""

from .. import jit
from .. import language as nl


@jit
def nki_matmul_tiled(lhsT, rhs):
    """Return ``lhsT.T @ rhs`` for ``lhsT`` [K, M] and ``rhs`` [K, N]."""
    K, M = lhsT.shape
    K2, N = rhs.shape
    assert K == K2, "contraction dimensions differ"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TM = nl.tile_size.gemm_stationary_fmax  # 128
    TK = nl.tile_size.pmax  # 128
    TN = nl.tile_size.gemm_moving_fmax  # 512
    for m in nl.affine_range((M + TM - 1) // TM):
        m0, m1 = m * TM, min((m + 1) * TM, M)
        for n in nl.affine_range((N + TN - 1) // TN):
            n0, n1 = n * TN, min((n + 1) * TN, N)
            res_psum = nl.zeros((m1 - m0, n1 - n0), nl.float32, buffer=nl.psum)
            for k in nl.affine_range((K + TK - 1) // TK):
                k0, k1 = k * TK, min((k + 1) * TK, K)
                lhsT_tile = nl.load(lhsT[k0:k1, m0:m1])
                rhs_tile = nl.load(rhs[k0:k1, n0:n1])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m0:m1, n0:n1], value=res_sb)
    return result


def reference(lhsT, rhs):
    return lhsT.T @ rhs


@jit
def nki_matmul_hoisted(lhsT, rhs):
    """``lhsT.T @ rhs`` loading every input tile from HBM exactly once.

    The tutorial's next step: the whole ``rhs`` is staged in SBUF (block dimension
    ``nl.par_dim``) and each 128-column block of ``lhsT`` is loaded once and reused for
    every output tile of its row, so HBM traffic drops to one read per input element.
    Requires ``rhs`` to fit in SBUF (the allocator raises NKIMemoryError otherwise).
    """
    from .. import isa as nisa

    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TM, TK, TN = (nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax)
    n_k = (K + TK - 1) // TK
    rhs_sb = nl.ndarray((n_k, nl.par_dim(TK), N), dtype=rhs.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(n_k):
        k0, k1 = k * TK, min((k + 1) * TK, K)
        nisa.dma_copy(dst=rhs_sb[k, 0 : k1 - k0, :], src=rhs[k0:k1, :])
    for m in nl.affine_range((M + TM - 1) // TM):
        m0, m1 = m * TM, min((m + 1) * TM, M)
        lhsT_sb = nl.ndarray((n_k, nl.par_dim(TK), m1 - m0), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(n_k):
            k0, k1 = k * TK, min((k + 1) * TK, K)
            nisa.dma_copy(dst=lhsT_sb[k, 0 : k1 - k0, :], src=lhsT[k0:k1, m0:m1])
        for n in nl.affine_range((N + TN - 1) // TN):
            n0, n1 = n * TN, min((n + 1) * TN, N)
            res_psum = nl.zeros((m1 - m0, n1 - n0), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(n_k):
                ksz = min((k + 1) * TK, K) - k * TK
                res_psum += nl.matmul(lhsT_sb[k, 0:ksz, :], rhs_sb[k, 0:ksz, n0:n1], transpose_x=True)
            nl.store(result[m0:m1, n0:n1], value=nl.copy(res_psum, dtype=result.dtype))
    return result
