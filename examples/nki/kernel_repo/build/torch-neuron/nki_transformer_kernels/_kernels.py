"""The NKI kernels of this repository (plain ``@nki.jit`` functions, HBM in / HBM out)."""
# The simulator's NKI under its package name: a bare `import nki` also works outside
# pytest, but a `tests/nki` directory on sys.path shadows that alias.
from torch_neuronx import nki
from torch_neuronx.nki import isa as nisa
from torch_neuronx.nki import language as nl


@nki.jit
def rms_norm_kernel(x, weight, eps):
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` for ``x`` [rows, d], ``weight`` [d].

    One 128-row tile per step: the sum of squares comes out of the same Scalar
    Engine instruction that squares, the reciprocal root is a second activation
    with the 1/d scale and eps bias folded in.
    """
    rows, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    w_row = nl.load(weight.reshape((1, d)), dtype=nl.float32)
    for t in nl.affine_range((rows + nl.tile_size.pmax - 1) // nl.tile_size.pmax):
        r0, r1 = t * nl.tile_size.pmax, min((t + 1) * nl.tile_size.pmax, rows)
        tile = nl.load(x[r0:r1, :], dtype=nl.float32)
        sq_sum = nl.ndarray((r1 - r0, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(op=nl.square, data=tile, reduce_op=nl.add, reduce_res=sq_sum)
        rstd = nisa.activation(op=nl.rsqrt, data=sq_sum, scale=1.0 / d, bias=eps)
        normed = nisa.tensor_scalar(tile, op0=nl.multiply, operand0=rstd)
        scaled = nl.multiply(normed, nl.broadcast_to(w_row, (r1 - r0, d)), dtype=x.dtype)
        nl.store(out[r0:r1, :], value=scaled)
    return out


@nki.jit
def mlp_kernel(x, w1, b1, w2, b2):
    """Transformer MLP ``gelu(x @ w1.T + b1) @ w2.T + b2`` in one kernel (exact erf GELU).

    ``x`` [n, d], ``w1`` [f, d], ``b1`` [f], ``w2`` [d, f], ``b2`` [d] (nn.Linear layouts).
    The hidden activation never goes to HBM: per 128-row block of x it is produced
    transposed (features on partitions), so b1 is a per-partition bias folded into
    the GELU activation that reads PSUM, and the transposed tile is directly the
    stationary operand of the second matmul, which accumulates over the features
    in PSUM. The unfused PyTorch version writes and re-reads [n, f] twice.
    """
    n, d = x.shape
    f = w1.shape[0]
    P = nl.tile_size.pmax
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    d_tiles = [(k * P, min((k + 1) * P, d)) for k in range((d + P - 1) // P)]
    f_tiles = [(i * P, min((i + 1) * P, f)) for i in range((f + P - 1) // P)]
    # Weights are DMA'd (transposed) into SBUF once and stay there for every row block.
    w1T = [[nl.load_transpose2d(w1[f0:f1, k0:k1]) for k0, k1 in d_tiles] for f0, f1 in f_tiles]
    w2T = [[nl.load_transpose2d(w2[d0:d1, f0:f1]) for d0, d1 in d_tiles] for f0, f1 in f_tiles]
    b1_cols = [nl.load(b1.reshape((f, 1))[f0:f1, :], dtype=nl.float32) for f0, f1 in f_tiles]
    b2_row = nl.load(b2.reshape((1, d)), dtype=nl.float32)
    NB = nl.tile_size.gemm_moving_fmax  # 512 rows per block: the first matmul streams 512 columns
    for bi in nl.affine_range((n + NB - 1) // NB):
        b0, b1 = bi * NB, min((bi + 1) * NB, n)
        row_tiles = [(r, min(r + P, b1)) for r in range(b0, b1, P)]
        xT = []  # per d tile: x[b0:b1, k0:k1] transposed, [k, block rows]
        for k0, k1 in d_tiles:
            t = nl.ndarray((k1 - k0, b1 - b0), dtype=x.dtype, buffer=nl.sbuf)
            for r0, r1 in row_tiles:
                t[:, r0 - b0:r1 - b0] = nl.load_transpose2d(x[r0:r1, k0:k1])
            xT.append(t)
        hT = []  # per f tile: gelu(w1 x^T + b1), [features, block rows]
        for fi in range(len(f_tiles)):
            f0, f1 = f_tiles[fi]
            acc = nl.zeros((f1 - f0, b1 - b0), nl.float32, buffer=nl.psum)
            for w_tile, x_tile in zip(w1T[fi], xT):
                acc += nisa.nc_matmul(w_tile, x_tile)
            hT.append(nisa.activation(op=nl.gelu, data=acc, bias=b1_cols[fi], dtype=x.dtype))
        for r0, r1 in row_tiles:
            for di, (d0, d1) in enumerate(d_tiles):
                acc = nl.zeros((r1 - r0, d1 - d0), nl.float32, buffer=nl.psum)
                for fi, h_tile in enumerate(hT):
                    acc += nisa.nc_matmul(h_tile[:, r0 - b0:r1 - b0], w2T[fi][di])  # [rows, out cols]
                y = nl.add(acc, nl.broadcast_to(b2_row[:, d0:d1], (r1 - r0, d1 - d0)), dtype=x.dtype)
                nl.store(out[r0:r1, d0:d1], value=y)
    return out
