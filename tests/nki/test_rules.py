"""Every hardware rule raises a typed error naming instruction, operand and limit."""

import numpy as np
import pytest

import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx import nki


def _run(body, *arrays, target="trn2"):
    """Run ``body`` as a kernel on NumPy inputs."""
    return nki.jit(body, platform_target=target)(*arrays)


def _raises(exc, body, *arrays, match=(), target="trn2"):
    with pytest.raises(exc) as info:
        _run(body, *arrays, target=target)
    msg = str(info.value)
    for part in match:
        assert part in msg, f"{part!r} not in {msg!r}"
    return info.value


A = np.zeros((256, 1024), np.float32)


def test_error_hierarchy():
    assert issubclass(nki.NKIPartitionError, ValueError)
    assert issubclass(nki.NKITileSizeError, ValueError)
    assert issubclass(nki.NKIIndexError, IndexError)
    assert issubclass(nki.NKIDtypeError, TypeError)
    assert issubclass(nki.NKIMemoryError, MemoryError)
    for cls in (nki.NKIPartitionError, nki.NKIIndexError, nki.NKIBufferError, nki.NKIContextError, nki.NKIShapeError):
        assert issubclass(cls, nki.NKIError)


def test_partition_limit_on_load():
    def k(a):
        nl.load(a[0:256, 0:4])

    _raises(nki.NKIPartitionError, k, A, match=("nl.load", "'result'", "256", "128"))


def test_partition_limit_on_allocation():
    def k(a):
        nl.ndarray((129, 4), nl.float32, buffer=nl.sbuf, name="big")

    _raises(nki.NKIPartitionError, k, A, match=("nl.ndarray(buffer=nl.sbuf)", "'big'", "129", "128"))


def test_psum_tile_free_size():
    def k(a):
        nl.ndarray((128, 513), nl.float32, buffer=nl.psum, name="acc")

    _raises(nki.NKITileSizeError, k, A, match=("nl.ndarray(buffer=nl.psum)", "'acc'", "2052", "2048", "psum_fmax=512"))

    def ok(a):
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nl.ndarray((128, 1024), nl.bfloat16, buffer=nl.psum)  # 2 KiB too: fits one bank

    _run(ok, A)


def test_psum_bank_count():
    def k(a):
        tiles = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        extra = nl.zeros((128, 1), nl.float32, buffer=nl.psum, name="ninth")
        for t in tiles + [extra]:  # all nine are read here, so all nine are live together
            nl.copy(t)

    _raises(nki.NKIMemoryError, k, A, match=("'ninth'", "PSUM capacity", "9 banks live at once > 8 banks"))

    def freed(a):  # loop-local tiles reuse banks
        for _ in range(20):
            t = nl.zeros((128, 512), nl.float32, buffer=nl.psum)  # noqa: F841

    _run(freed, A)

    def dead_but_named(a):
        # a tile holds its bank until its last access, not while a Python name refers to it
        kept = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        for t in kept:
            nl.copy(t)
        later = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        nl.copy(later)

    _run(dead_but_named, A)


def test_matmul_stationary_and_moving_limits():
    def stationary(a):
        st = nl.zeros((128, 129), nl.bfloat16)
        mv = nl.zeros((128, 512), nl.bfloat16)
        nisa.nc_matmul(st, mv)

    _raises(
        nki.NKITileSizeError,
        stationary,
        A,
        match=("nisa.nc_matmul", "'stationary'", "129", "gemm_stationary_fmax", "128"),
    )

    def moving(a):
        st = nl.zeros((128, 128), nl.bfloat16)
        mv = nl.zeros((128, 513), nl.bfloat16)
        nisa.nc_matmul(st, mv)

    _raises(nki.NKITileSizeError, moving, A, match=("nisa.nc_matmul", "'moving'", "513", "gemm_moving_fmax", "512"))

    def contraction(a):
        nl.matmul(nl.zeros((64, 128), nl.bfloat16), nl.zeros((32, 128), nl.bfloat16), transpose_x=True)

    _raises(nki.NKITileSizeError, contraction, A, match=("nl.matmul", "'y'", "32", "64"))


def test_sbuf_capacity_trn2_vs_trn3():
    # 60000 fp32 = 240000 B per partition: over trn2's 224 KiB, under trn3's 256 KiB
    def k(a):
        nl.ndarray((128, 60000), nl.float32, buffer=nl.sbuf, name="huge")

    _raises(nki.NKIMemoryError, k, A, match=("'huge'", "SBUF capacity", "229376", "28 MiB", "trn2"))
    _run(k, A, target="trn3")

    def accumulate(a):  # live tiles add up
        keep = [nl.ndarray((128, 16384), nl.float32) for _ in range(3)]
        nl.ndarray((128, 16384), nl.float32, name="fourth")
        return keep

    _raises(nki.NKIMemoryError, accumulate, A, match=("'fourth'", "196608 + 65536"))


def test_engine_dtypes():
    def int_matmul(a):
        nisa.nc_matmul(nl.zeros((128, 128), nl.int32), nl.zeros((128, 128), nl.bfloat16))

    _raises(nki.NKIDtypeError, int_matmul, A, match=("nisa.nc_matmul", "'stationary'", "int32", "Tensor Engine"))

    def bf16_psum(a):
        dst = nl.zeros((128, 128), nl.bfloat16, buffer=nl.psum, name="acc")
        nisa.nc_matmul(nl.zeros((128, 128), nl.bfloat16), nl.zeros((128, 128), nl.bfloat16), dst=dst)

    _raises(nki.NKIDtypeError, bf16_psum, A, match=("nisa.nc_matmul", "'dst'", "float32", "trn2"))
    _run(bf16_psum, A, target="trn3")  # NeuronCore-v4 writes bf16 to PSUM


def test_out_of_bounds_slice_and_index_arrays():
    small = np.zeros((100, 64), np.float32)

    def slice_oob(a):
        nl.load(a[0:128, :])

    _raises(nki.NKIIndexError, slice_oob, small, match=("nl.load", "'src'", "0:128", "size 100"))

    def index_oob(a):
        i_p = nl.arange(128)[:, None]
        nl.load(a[i_p, nl.arange(64)[None, :]])

    _raises(nki.NKIIndexError, index_oob, small, match=("nl.load", "'src'", "100", "add a mask"))

    def masked(a):
        i_p = nl.arange(128)[:, None]
        t = nl.load(a[i_p, nl.arange(64)[None, :]], mask=i_p < 100)
        return t

    _run(masked, small)

    def store_oob(a):
        out = nl.ndarray((100, 64), nl.float32, buffer=nl.shared_hbm, name="out")
        nl.store(out[64:192, :], nl.zeros((128, 64), nl.float32))

    _raises(nki.NKIIndexError, store_oob, small, match=("nl.store", "'dst'", "64:192", "100"))


def test_memory_placement_rules():
    def compute_on_hbm(a):
        nl.exp(a)

    _raises(nki.NKIBufferError, compute_on_hbm, A, match=("nl.exp", "'x'", "HBM", "nl.load"))

    def dma_from_psum(a):
        # (nl.store of a PSUM tile is allowed: the compiler copies it to SBUF first)
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.zeros((128, 4), nl.float32, buffer=nl.psum))

    _raises(nki.NKIBufferError, dma_from_psum, A, match=("nisa.dma_copy", "'src'", "PSUM"))

    def load_from_sbuf(a):
        nl.load(nl.zeros((128, 4), nl.float32))

    _raises(nki.NKIBufferError, load_from_sbuf, A, match=("nl.load", "'src'", "SBUF"))

    def matmul_from_psum(a):
        nisa.nc_matmul(nl.zeros((128, 128), nl.bfloat16, buffer=nl.psum), nl.zeros((128, 128), nl.bfloat16))

    _raises(nki.NKIBufferError, matmul_from_psum, A, match=("nisa.nc_matmul", "'stationary'", "SBUF only"))


def test_partition_axis_reduction_rejected():
    def k(a):
        nl.sum(nl.load(a[0:128, 0:8]), axis=0)

    _raises(nki.NKIShapeError, k, A, match=("nl.sum", "'x'", "partition axis"))


def test_api_outside_kernel():
    with pytest.raises(nki.NKIContextError, match="inside a running @nki.jit kernel"):
        nl.zeros((4, 4), nl.float32)


def _psum_blocks_kernel(n_live):
    # a PSUM block tensor declared outside the loop (the attention tutorials' style): each
    # block is written by one matmul and read n_live - 1 iterations later
    @nki.jit
    def k(a, b):
        n = a.shape[0]
        out = nl.ndarray((n, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((n, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum, name="scores")
        bt = nl.load(b)
        for i in nl.affine_range(n):
            nisa.nc_matmul(ps[i], nl.load(a[i]), bt)
            if i >= n_live - 1:
                nl.store(out[i - (n_live - 1)], ps[i - (n_live - 1)])
        for j in range(n - n_live + 1, n):
            nl.store(out[j], ps[j])
        return out

    return k


def test_psum_block_tensor_holds_banks_only_while_blocks_live():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((12, 64, 128)).astype(np.float32), rng.standard_normal((64, 512)).astype(np.float32)
    ref = np.einsum("nkm,kf->nmf", a, b)
    for n_live in (1, 8):  # 12 blocks of one bank each, at most n_live live at once
        k = _psum_blocks_kernel(n_live)
        np.testing.assert_allclose(k(a, b), ref, rtol=1e-5, atol=1e-4)
        assert k.cost_report().psum_peak_banks == n_live
    with pytest.raises(nki.NKIMemoryError, match=r"9 banks live at once > 8 banks .*'scores' \(9 blocks\)"):
        _psum_blocks_kernel(9)(a, b)


def test_empty_launch_grid_is_rejected():
    # kernel[0] would run no program and return None: an error, not a silent no-op
    k = nki.jit(lambda a: a)
    with pytest.raises(ValueError, match="every dimension must be >= 1, got 0"):
        k[0]
