"""Direct allocation, bit-cast views and nisa.sequence_bounds, checked against NumPy.

Written from AWS's NKI direct-allocation guide and API reference: a logical tile of a
directly allocated tensor lives at the (partition, byte) its allocation function gives,
``mod_alloc`` cycles logical tiles over ``num_*_tiles`` physical tiles, tensors at the same
addresses share the same bytes, and ``view(dtype)`` reinterprets bytes like
``numpy.ndarray.view`` (the last dimension scales by the ratio of element sizes).
"""

import numpy as np
import pytest

import torch_neuronx.nki.compiler as ncc
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx import nki
from torch_neuronx.nki import NKIMemoryError, NKIShapeError, NKIUninitializedError

RNG = np.random.default_rng(11)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _out(t):
    o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nl.store(o, t)
    return o


# ----- direct allocation ------------------------------------------------------------------
def test_mod_alloc_cycles_logical_tiles_over_physical_tiles():
    # 4 logical tiles over 2 physical ones: tile 2 reuses tile 0's bytes, tile 3 tile 1's
    a = _x(4, 128, 64)

    @nki.jit
    def k(a):
        t = nl.ndarray(
            (4, nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,))
        )
        for i in nl.affine_range(4):
            t[i] = nl.load(a[i])
        return _out(t[0]), _out(t[1]), _out(t[2]), _out(t[3])

    t0, t1, t2, t3 = k(a)
    np.testing.assert_array_equal(t0, a[2])
    np.testing.assert_array_equal(t1, a[3])
    np.testing.assert_array_equal(t2, a[2])
    np.testing.assert_array_equal(t3, a[3])


def test_double_buffering_gives_exact_results():
    a = _x(6, 128, 32)

    @nki.jit
    def k(a):
        out = nl.ndarray((6, 128, 32), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(
            (6, nl.par_dim(128), 32), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=512, num_free_tiles=(2,))
        )
        r = nl.ndarray(
            (6, nl.par_dim(128), 32), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=1024, num_free_tiles=(2,))
        )
        for i in nl.affine_range(6):
            t[i] = nl.load(a[i])
            r[i] = nisa.activation(op=nl.exp, data=t[i])
            nl.store(out[i], r[i])
        return out

    np.testing.assert_allclose(k(a), np.exp(a), rtol=1e-6)


def test_overlapping_allocations_share_bytes():
    # t0 covers bytes [0, 256) of each partition, t1 bytes [128, 384): writing t1 overwrites
    # the upper half of t0, as on the hardware
    a, b = _x(128, 64), _x(128, 64)

    @nki.jit
    def k(a, b):
        t0 = nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        t1 = nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=128))
        t0[...] = nl.load(a)
        t1[...] = nl.load(b)
        return _out(t0)

    np.testing.assert_array_equal(k(a, b), np.concatenate([a[:, :32], b[:, :32]], axis=1))


def test_alias_never_written_through_is_uninitialised():
    # the bytes hold t0's data, but t1 itself was never written: NKI treats it as undefined
    @nki.jit
    def k(a):
        t0 = nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        t1 = nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        t0[...] = nl.load(a)
        return _out(t1)

    with pytest.raises(NKIUninitializedError, match="uninitialised"):
        k(_x(128, 64))


def test_alloc_function_places_tiles():
    # the guide's simple_1d_alloc_func: tile i at byte i * fdim_size; called with keywords,
    # so functools.partial can bind extra arguments
    seen = []

    def place(base, idx, pdim_size, fdim_size):
        seen.append((idx, pdim_size, fdim_size))
        (i,) = idx
        return 0, base + i * fdim_size

    import functools

    a = _x(3, 128, 16)

    @nki.jit
    def k(a):
        t = nl.ndarray((3, nl.par_dim(128), 16), nl.float32, buffer=ncc.sbuf.alloc(functools.partial(place, 64)))
        for i in nl.affine_range(3):
            t[i] = nl.load(a[i])
        return _out(t[0]), _out(t[1]), _out(t[2])

    outs = k(a)
    for i in range(3):
        np.testing.assert_array_equal(outs[i], a[i])
    assert seen == [((0,), 128, 64), ((1,), 128, 64), ((2,), 128, 64)]


def test_small_tiles_cycle_over_partition_quadrants():
    a = _x(4, 32, 8)

    @nki.jit
    def k(a):
        t = nl.ndarray((4, nl.par_dim(32), 8), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0, num_par_tiles=(4,)))
        for i in nl.affine_range(4):
            t[i] = nl.load(a[i])
        return _out(t[0]), _out(t[3])

    t0, t3 = k(a)
    np.testing.assert_array_equal(t0, a[0])
    np.testing.assert_array_equal(t3, a[3])


def test_sbuf_capacity_and_partition_rules():
    cap = nki.get_hardware("trn2").sbuf_partition_bytes

    @nki.jit(platform_target="trn2")
    def too_far(a):
        nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=cap - 100))

    with pytest.raises(NKIMemoryError, match=f"does not fit in SBUF: {cap} bytes per partition"):
        too_far(_x(1, 1))

    @nki.jit
    def bad_start(a):
        nl.ndarray((nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0, base_partition=32))

    with pytest.raises(NKIMemoryError, match="more than 64 partitions starts at 0"):
        bad_start(_x(1, 1))


def test_psum_mod_alloc_reused_bank_starts_a_new_accumulation():
    # two logical PSUM tiles in one bank: each accumulates its own K blocks from scratch
    x, w = _x(2, 2, 64, 128), _x(2, 64, 256)

    @nki.jit
    def k(x, w):
        out = nl.ndarray((2, 128, 256), nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((2, nl.par_dim(128), 256), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=3))
        for i in nl.affine_range(2):
            for kk in nl.affine_range(2):
                ps[i] += nisa.nc_matmul(nl.load(x[i, kk]), nl.load(w[kk]))
            nl.store(out[i], nl.copy(ps[i]))
        return out

    ref = np.einsum("ikpm,kpn->imn", x, w)
    np.testing.assert_allclose(k(x, w), ref, rtol=1e-5, atol=1e-4)


def test_psum_alloc_checks_banks():
    @nki.jit
    def k(a):
        nl.ndarray(
            (2, nl.par_dim(128), 512),
            nl.float32,
            buffer=ncc.psum.alloc(lambda idx, pdim_size, fdim_size: (7 + idx[0], 0, 0)),
        )

    with pytest.raises(NKIMemoryError, match=r"PSUM bank 8; trn2 has banks 0\.\.7"):
        k(_x(1, 1))


def test_allocation_in_a_traced_loop_is_decided_once():
    # NKI traces an affine_range/sequential_range body once: the allocation statement in it
    # gets one place, however the kernel's Python address counter moves afterwards
    a = _x(3, 128, 16)
    cap = nki.get_hardware("trn2").sbuf_partition_bytes

    @nki.jit(platform_target="trn2")
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        addr = 0
        for i in nl.sequential_range(3):
            t = nl.ndarray((nl.par_dim(128), 16), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
            addr += cap  # a second trace of this body would place t past the end of SBUF
            t[...] = nl.load(a[i])
            nl.store(out[i], t)
        return out

    np.testing.assert_array_equal(k(a), a)

    @nki.jit(platform_target="trn2")
    def unrolled(a):  # a Python loop is unrolled by the trace: each statement is placed anew
        addr = 0
        for _ in range(2):
            nl.ndarray((nl.par_dim(128), 16), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
            addr += cap

    with pytest.raises(NKIMemoryError, match="does not fit in SBUF"):
        unrolled(a)


# ----- bit-cast views -----------------------------------------------------------------------
def test_view_same_size_and_rescaled_last_dim():
    a = _x(128, 16)

    @nki.jit
    def k(a):
        t = nl.load(a)
        return _out(t.view(nl.int32)), _out(t.view(nl.uint8)), _out(t.view(nl.uint8).view(nl.float32))

    as_int, as_bytes, back = k(a)
    np.testing.assert_array_equal(as_int, a.view(np.int32))
    assert as_bytes.shape == (128, 64)
    np.testing.assert_array_equal(as_bytes, a.view(np.uint8))
    np.testing.assert_array_equal(back, a)


def test_view_writes_are_seen_by_the_original():
    a = _x(128, 8)

    @nki.jit
    def k(a):
        t = nl.load(a)
        bits = t.view(nl.uint32)
        bits[:, 0:4] = nl.bitwise_and(bits[:, 0:4], 0x7FFFFFFF)  # clear the sign bit: |x|
        return _out(t)

    np.testing.assert_array_equal(k(a), np.concatenate([np.abs(a[:, :4]), a[:, 4:]], axis=1))


def test_view_16_bit_and_fp8_bit_patterns():
    # bf16 1.0 is 0x3F80, -2.0 is 0xC000; FP8 E4M3 0x38 is 1.0 and 0x7E is 448 (its max);
    # FP8 E5M2 0x3C is 1.0 and 0x7B is 57344 (its max)
    codes = np.array([[0x38, 0x7E, 0xB8, 0x01, 0x3C, 0x7B, 0xBC, 0x00]], np.uint8)

    @nki.jit
    def k(c):
        f = nl.full((1, 2), 1.0, nl.bfloat16)
        f[:, 1:2] = nl.full((1, 1), -2.0, nl.bfloat16)
        raw = nl.load(c)
        e4 = nl.copy(raw[:, 0:4].view(nl.float8_e4m3), dtype=nl.float32)
        e5 = nl.copy(raw[:, 4:8].view(nl.float8_e5m2), dtype=nl.float32)
        return _out(f.view(nl.uint16)), _out(e4), _out(e5)

    bits, e4, e5 = k(codes)
    np.testing.assert_array_equal(bits, [[0x3F80, 0xC000]])
    np.testing.assert_array_equal(e4, [[1.0, 448.0, -1.0, 2.0**-9]])
    np.testing.assert_array_equal(e5, [[1.0, 57344.0, -1.0, 0.0]])


def test_fp8_view_of_hbm_bytes_round_trips():
    vals = np.array([[0.5, -3.0, 240.0, 0.015625]], np.float32)  # exact in E4M3

    @nki.jit
    def k(x):
        q = nl.ndarray((1, 4), nl.float8_e4m3, buffer=nl.sbuf)
        q[...] = nl.copy(nl.load(x), dtype=nl.float8_e4m3)
        return _out(q.view(nl.uint8))

    codes = k(vals)

    @nki.jit
    def back(c):
        out = nl.ndarray((1, 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(c.view(nl.float8_e4m3)), dtype=nl.float32))
        return out

    np.testing.assert_array_equal(codes, [[0x30, 0xC4, 0x77, 0x08]])
    np.testing.assert_array_equal(back(codes), vals)


def test_view_errors():
    @nki.jit
    def odd(a):
        nl.load(a).view(nl.float32)

    with pytest.raises(NKIShapeError, match="not a multiple of 4 bytes"):
        odd(np.zeros((4, 6), np.uint8))

    @nki.jit
    def strided(a):
        nl.load(a)[:, ::2].view(nl.uint8)

    with pytest.raises(NKIShapeError, match="contiguous"):
        strided(_x(4, 8))


def test_numpy_dtype_of_nki_dtypes():
    # kernels size buffers with np.dtype(nl.X).itemsize; bf16 and FP8 are ml_dtypes' types
    # (as with AWS's NKI); tf32 has no host type and says so
    import ml_dtypes

    assert np.dtype(nl.float32) == np.float32 and np.dtype(nl.float16) == np.float16
    assert np.dtype(nl.uint16).itemsize == 2 and np.dtype(nl.int8) == np.int8
    assert np.dtype(nl.bfloat16) == ml_dtypes.bfloat16 and np.dtype(nl.bfloat16).itemsize == 2
    assert np.dtype(nl.float8_e4m3) == ml_dtypes.float8_e4m3fn and np.dtype(nl.float8_e5m2) == ml_dtypes.float8_e5m2
    with pytest.raises(NotImplementedError, match="has no NumPy dtype here"):
        np.dtype(nl.tfloat32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3", "float8_e5m2"])
def test_bf16_and_fp8_host_arrays_in_and_out(dtype):
    # nl.static_cast of a host array gives the ml_dtypes array (nearest even, like torch's
    # casts); kernels take such arrays and see the same values
    import torch

    d = getattr(nl, dtype)
    torch_dtype = {"bfloat16": torch.bfloat16, "float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    x = _x(128, 64)
    h = nl.static_cast(x, d)
    assert h.dtype == np.dtype(d)
    expect = torch.from_numpy(x).to(torch_dtype[dtype]).float().numpy()
    np.testing.assert_array_equal(h.astype(np.float32), expect)

    @nki.jit
    def double(a):
        t = nl.load(a)
        return _out(nl.multiply(t, 2.0, dtype=nl.float32))

    np.testing.assert_array_equal(double(h), expect * 2)


# ----- nisa.sequence_bounds -----------------------------------------------------------------
def _bounds(ids):
    n = len(ids)
    start, end = np.zeros(n), np.zeros(n)
    for i in range(n):
        if ids[i] == 0:
            start[i], end[i] = n, -1
            continue
        j = i
        while j > 0 and ids[j - 1] == ids[i]:
            j -= 1
        e = i + 1
        while e < n and ids[e] == ids[i]:
            e += 1
        start[i], end[i] = j, e
    return np.stack([start, end])[None]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_sequence_bounds(dtype):
    doc = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dtype)
    rand = np.sort(RNG.integers(0, 6, 40)).astype(dtype)[None]

    @nki.jit
    def k(s):
        out = nl.ndarray((1, 2, s.shape[1]), s.dtype, buffer=nl.shared_hbm)
        res = nl.ndarray((1, 2, s.shape[1]), s.dtype, buffer=nl.sbuf)
        nisa.sequence_bounds(res, nl.load(s))
        nl.store(out, res)
        return out

    np.testing.assert_array_equal(k(doc), [[[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]])
    np.testing.assert_array_equal(k(rand), _bounds(rand[0]))


def test_sequence_bounds_needs_one_partition():
    @nki.jit
    def k(s):
        nisa.sequence_bounds(segment_ids=nl.load(s))

    with pytest.raises(NKIShapeError, match=r"\[1, n\] tile"):
        k(np.ones((2, 4), np.float32))
