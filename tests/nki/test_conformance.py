"""NKI API conformance: every public name checked on small cases against NumPy.

Written from AWS's public nki.language / nki.isa API reference (semantics stated in
each test), not from the tutorials: reductions keep the partition axis, positional
``dst`` comes first, masks exclude elements, uninitialised memory is never silently 0.
"""

import numpy as np
import pytest

import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx import nki
from torch_neuronx.nki import NKIDtypeError, NKIShapeError, NKIUninitializedError

RNG = np.random.default_rng(7)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _run(body, *args):
    """Run ``body(*hbm_args)`` as a kernel; it returns on-chip tiles, stored to HBM."""

    @nki.jit
    def k(*a):
        tiles = body(*a)
        tiles = tiles if isinstance(tiles, tuple) else (tiles,)
        outs = []
        for t in tiles:
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
            nl.store(o, t if t.buffer == nl.sbuf else nl.copy(t))
            outs.append(o)
        return tuple(outs) if len(outs) > 1 else outs[0]

    return k(*args)


# ----- 1. reductions keep the partition axis ----------------------------------------------
@pytest.mark.parametrize(
    "fn,ref",
    [(nl.sum, np.sum), (nl.max, np.max), (nl.min, np.min), (nl.mean, np.mean), (nl.prod, np.prod), (nl.var, np.var)],
)
def test_reduction_without_keepdims_is_p_by_1_and_broadcasts_along_free(fn, ref):
    a = _x(128, 128) * 0.5
    r, centred = _run(lambda t: (fn(nl.load(t), axis=1), nl.load(t) - fn(nl.load(t), axis=1)), a)
    assert r.shape == (128, 1)
    np.testing.assert_allclose(r[:, 0], ref(a, axis=1), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(centred, a - ref(a, axis=1, keepdims=True), rtol=2e-5, atol=1e-5)


def test_softmax_written_with_reductions_matches_numpy_at_free_128():
    a = _x(128, 128) * 3

    def body(t):
        x = nl.load(t)
        e = nl.exp(nl.subtract(x, nl.max(x, axis=1)))
        return nl.divide(e, nl.sum(e, axis=1))

    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(_run(body, a), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_masked_reductions_ignore_masked_elements():
    a = _x(64, 100)
    i_p, i_f = nl.mgrid[0:64, 0:100]
    m = i_f < 37
    r = _run(lambda t: (nl.max(nl.load(t), axis=1, mask=m), nl.mean(nl.load(t), axis=1, mask=m)), a)
    np.testing.assert_allclose(r[0][:, 0], a[:, :37].max(1))
    np.testing.assert_allclose(r[1][:, 0], a[:, :37].mean(1), rtol=1e-5)


def test_reduction_into_p1_dst_and_ds_view():
    a = _x(128, 4, 64)

    def body(t):
        x = nl.load(t)
        acc = nl.ndarray((128, 4), nl.float32)
        for j in nl.affine_range(4):
            nisa.tensor_reduce(acc[:, nl.ds(j, 1)], nl.add, x[:, j, :], axis=1)
        one = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_reduce(dst=one, op=nl.maximum, data=x, axis=(1, 2), negate=True)
        return acc, one

    acc, one = _run(body, a)
    np.testing.assert_allclose(acc, a.sum(2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one[:, 0], -a.max(axis=(1, 2)))


def test_integer_free_index_gives_p_by_1_operand():
    a = _x(128, 16)

    def body(t):
        x = nl.load(t)
        col = x[:, 3]
        assert col.shape == (128, 1)
        return nisa.tensor_scalar(x, nl.subtract, col)

    np.testing.assert_allclose(_run(body, a), a - a[:, 3:4])


# ----- 2. current (dst-first) signatures ---------------------------------------------------
def test_positional_dst_first_for_every_instruction():
    a, b = _x(128, 64), _x(128, 64)
    st, mv = _x(128, 32), _x(128, 64)

    def body(ta, tb, ts, tm):
        x, y, s, m = nl.load(ta), nl.load(tb), nl.load(ts), nl.load(tm)
        cp = nl.ndarray((128, 64), nl.float32)
        nisa.tensor_copy(cp, x)
        act = nl.ndarray((128, 64), nl.float32)
        nisa.activation(act, nl.exp, x, bias=None, scale=0.5)
        tt = nl.ndarray((128, 64), nl.float32)
        nisa.tensor_tensor(tt, x, y, nl.multiply)
        ts_ = nl.ndarray((128, 64), nl.float32)
        nisa.tensor_scalar(ts_, x, nl.add, 2.0, op1=nl.multiply, operand1=3.0)
        red = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_reduce(red, nl.add, x, axis=1)
        rc = nl.ndarray((128, 64), nl.float32)
        nisa.reciprocal(rc, y)
        ps = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, s, m)
        return cp, act, tt, ts_, red, rc, ps

    cp, act, tt, ts_, red, rc, ps = _run(body, a, b, st, mv)
    np.testing.assert_array_equal(cp, a)
    np.testing.assert_allclose(act, np.exp(0.5 * a), rtol=1e-6)
    np.testing.assert_allclose(tt, a * b, rtol=1e-6)
    np.testing.assert_allclose(ts_, (a + 2) * 3, rtol=1e-6)
    np.testing.assert_allclose(red[:, 0], a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rc, 1 / b, rtol=1e-6)
    np.testing.assert_allclose(ps, st.T @ mv, rtol=1e-4, atol=1e-4)


def test_nc_matmul_accumulate_modes():
    st, mv = _x(128, 16), _x(128, 32)

    def body(ts, tm):
        s, m = nl.load(ts), nl.load(tm)
        auto = nl.ndarray((16, 32), nl.float32, buffer=nl.psum)
        for _ in nl.affine_range(3):
            nisa.nc_matmul(auto, s, m)  # None: first overwrites, later accumulate
        over = nl.ndarray((16, 32), nl.float32, buffer=nl.psum)
        for _i in nl.affine_range(3):
            nisa.nc_matmul(dst=over, stationary=s, moving=m, accumulate=False)
        return auto, over

    auto, over = _run(body, st, mv)
    np.testing.assert_allclose(auto, 3 * st.T @ mv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(over, st.T @ mv, rtol=1e-4, atol=1e-4)


def test_nc_matmul_transpose_mode_transposes_stationary():
    a = _x(64, 100)

    def body(t):
        x = nl.load(t)
        out = nl.ndarray((100, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, x, nl.shared_identity_matrix(64, dtype=nl.float32), is_transpose=True)
        return out

    np.testing.assert_array_equal(_run(body, a), a.T)

    def wrong(t):
        x = nl.load(t)
        return nisa.nc_matmul(x, x[:, 0:64], is_transpose=True)

    with pytest.raises(NKIShapeError, match="identity"):
        _run(wrong, a)


def test_nc_matmul_double_row_fp8_contracts_both_rows():
    # perf_mode=double_row packs two FP8 rows per partition: [K, 2, M] x [K, 2, N] -> [M, N]
    import ml_dtypes

    a = nl.static_cast(_x(128, 2, 16), nl.float8_e5m2)
    b = nl.static_cast(_x(128, 2, 64), nl.float8_e4m3)

    def body(ta, tb):
        return nisa.nc_matmul(nl.load(ta), nl.load(tb), perf_mode=nisa.matmul_perf_mode.double_row)

    expect = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(_run(body, a, b), expect, rtol=1e-5, atol=1e-4)
    assert a.dtype == ml_dtypes.float8_e5m2

    def not_fp8(ta):
        t = nl.load(ta)
        return nisa.nc_matmul(t, t, perf_mode=nisa.matmul_perf_mode.double_row)

    with pytest.raises(NKIDtypeError, match="FP8"):
        _run(not_fp8, _x(128, 2, 16))


def test_memset_activation_copy_and_nl_copy_op():
    a = _x(32, 8)

    def body(t):
        m = nl.ndarray((32, 8), nl.bfloat16)
        nisa.memset(dst=m, value=1.5)
        old = nisa.memset((32, 8), 2.0, nl.float32)
        c = nl.ndarray((32, 8), nl.float32)
        nisa.activation(dst=c, op=nl.copy, data=nl.load(t), scale=2.0)
        return m, old, c

    m, old, c = _run(body, a)
    assert (np.asarray(m, np.float32) == 1.5).all() and (old == 2.0).all()
    np.testing.assert_array_equal(c, 2 * a)


def test_memset_accepts_both_documented_forms_and_positional_engine():
    def body():
        a = nl.ndarray((16, 8), nl.float32)
        nisa.memset(a, 3.0, nisa.engine.gpsimd)  # AWS's current signature: memset(dst, value, engine)
        b = nl.ndarray((16, 8), nl.int32)
        nisa.memset(dst=b, value=4)
        c = nisa.memset(shape=(16, 8), value=5.0, dtype=nl.float32)
        d = nisa.memset((16, 8), 6, dtype=nl.int32)
        return a, b, c, d

    a, b, c, d = _run(body)
    assert (a == 3.0).all() and (b == 4).all() and (c == 5.0).all() and (d == 6).all()
    assert b.dtype == np.int32 and d.dtype == np.int32


@pytest.mark.parametrize(
    "call",
    [
        lambda t: nisa.memset(t.shape, 0.5, nl.float32, dst=t),  # old positionals + new dst=
        lambda t: nisa.memset(t, 0.5, nl.float32),
        lambda t: nisa.memset(dst=t, value=0.5, dtype=nl.float32),
        lambda t: nisa.memset(t, value=0.5, shape=t.shape),
        lambda t: nisa.memset(t.shape, 0.5),  # old form without dtype
        lambda t: nisa.memset(t),  # no value
        lambda t: nisa.memset(t.shape, 0.5, nl.float32, 1.0),
        lambda t: nisa.memset(t.shape, 0.5, nl.float32, value=1.0),
    ],
)
def test_memset_rejects_calls_matching_neither_form(call):
    def body():
        t = nl.ndarray((16, 8), nl.float32)
        call(t)
        return t

    with pytest.raises(TypeError, match=r"nisa\.memset\(dst, value\).*nisa\.memset\(shape, value, dtype\)"):
        _run(body)


def test_activation_reduce_into_p1():
    a = _x(128, 200)

    def body(t):
        out = nl.ndarray((128, 200), nl.float32)
        rs = nl.ndarray((128, 1), nl.float32)
        nisa.activation(out, nl.exp, nl.load(t), reduce_op=nl.add, reduce_res=rs)
        return out, rs

    out, rs = _run(body, a)
    np.testing.assert_allclose(rs[:, 0], np.exp(a).sum(1), rtol=1e-5)


# ----- 1. silent wrong answers that must not come back -------------------------------------
def test_bn_stats_with_mask_counts_only_live_elements():
    d = 700  # not a multiple of 512: the second chunk is masked
    a = _x(128, d) * 2 + 1

    def body(t):
        stats = nl.ndarray((128, 12), nl.float32)
        for c in nl.affine_range(2):
            i_p, i_f = nl.mgrid[0:128, 0:512]
            x = nl.load(t[i_p, c * 512 + i_f], mask=(c * 512 + i_f < d))
            nisa.bn_stats(stats[:, nl.ds(c * 6, 6)], x, mask=(c * 512 + i_f < d))
        mv = nl.ndarray((128, 2), nl.float32)
        nisa.bn_aggr(mv, stats)
        return mv

    mv = _run(body, a)
    np.testing.assert_allclose(mv[:, 0], a.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mv[:, 1], a.var(1), rtol=1e-5)


def test_uninitialised_reads_raise_and_unwritten_outputs_are_nan():
    def body(t):
        x = nl.ndarray((128, 16), nl.float32)
        x[:, 0:8] = nl.load(t[:, 0:8])
        return nl.add(x, 1.0)  # reads columns 8..15 that nothing wrote

    with pytest.raises(NKIUninitializedError, match="uninitialised"):
        _run(body, _x(128, 16))

    @nki.jit
    def partial(t):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:8], nl.load(t[:, 0:8]))
        return out

    out = partial(_x(128, 16))
    assert np.isnan(out[:, 8:]).all() and not np.isnan(out[:, :8]).any()


# ----- 3. names public kernels use ---------------------------------------------------------
def test_tile_broadcast_to_expand_dims_and_ds():
    a = _x(128, 1)
    b = _x(1, 64)

    def body(ta, tb):
        col, row = nl.load(ta), nl.load(tb)
        c = col.broadcast_to((128, 64))
        r = nl.broadcast_to(row, (128, 64))
        e = nl.expand_dims(nl.load(ta)[:, 0], 1)
        return c, r, nl.load(ta)[nl.ds(0, 64), :], e

    c, r, sl, e = _run(body, a, b)
    np.testing.assert_array_equal(c, np.broadcast_to(a, (128, 64)))
    np.testing.assert_array_equal(r, np.broadcast_to(b, (128, 64)))
    np.testing.assert_array_equal(sl, a[:64])
    assert e.shape == (128, 1, 1)
    with pytest.raises(NKIShapeError, match="rank"):
        _run(lambda t: nl.broadcast_to(nl.load(t), (2, 128, 1)), a)


def test_spmd_dim_nc_baremetal_typing_and_simulate_kernel():
    from torch_neuronx.nki.typing import tensor

    @nki.baremetal
    def k(a: tensor[4, 8]):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i : i + 1, :], nl.add(nl.load(a[i : i + 1, :]), i))
        return out

    a = _x(4, 8)
    out = k[nl.spmd_dim(2, nl.nc(2))](a)
    np.testing.assert_allclose(out, a + np.arange(4)[:, None])
    np.testing.assert_allclose(nki.simulate_kernel(k[4], a), out)


def test_tile_size_constants():
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_bank_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (128, 512, 128, 512)
    assert ts.psum_bank_fmax_bytes == 2048 and ts.bn_stats_fmax == 512
    for name in ("psum_min_align", "sbuf_min_align"):
        with pytest.raises(NotImplementedError, match=name):
            getattr(ts, name)
    assert nl.fp32.min == float(np.finfo(np.float32).min)


def test_elementwise_functions_against_formulas():
    import math

    a = _x(16, 32)
    g = np.vectorize(math.erf)
    refs = {
        nl.erf_dx: 2 / np.sqrt(np.pi) * np.exp(-(a.astype(np.float64) ** 2)),
        nl.gelu_apprx_sigmoid: a * (1 / (1 + np.exp(-1.702 * a.astype(np.float64)))),
        nl.gelu: 0.5 * a * (1 + g(a / np.sqrt(2))),
        nl.erf: g(a),
    }
    outs = _run(lambda t: tuple(f(nl.load(t)) for f in refs), a)
    for o, ref in zip(outs, refs.values()):
        np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-6)


def test_gather_flattened_and_shared_identity():
    data = _x(32, 50)
    idx = RNG.integers(0, 50, (32, 20)).astype(np.int32)
    g = _run(lambda d, i: nl.gather_flattened(nl.load(d), nl.load(i)), data, idx)
    np.testing.assert_array_equal(g, np.take_along_axis(data, idx, 1))
    eye = _run(lambda d: nl.shared_identity_matrix(16, dtype=nl.float32), data)
    np.testing.assert_array_equal(eye, np.eye(16))


def test_atomic_rmw_and_dropout():
    @nki.jit
    def k(acc, v):
        nl.atomic_rmw(acc, nl.load(v), nl.add)
        out = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
        t = nl.load(v)
        kept = nl.dropout(t, 0.0)
        dropped = nisa.dropout(nl.ndarray(v.shape, v.dtype), t, 1.0)
        nl.store(out, nl.add(kept, dropped))
        half = nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm)
        nl.store(half, nl.dropout(nl.full(v.shape, 1.0, nl.float32), 0.5))
        return out, half

    acc, v = np.ones((64, 256), np.float32), _x(64, 256)
    out, half = k(acc, v)
    np.testing.assert_allclose(acc, 1 + v, rtol=1e-6)
    np.testing.assert_array_equal(out, v)
    assert set(np.unique(half)) <= {0.0, 1.0} and 0.4 < half.mean() < 0.6


def test_unsimulated_collectives_raise():
    def body(t):
        nl.all_reduce(nl.load(t), op=nl.add)

    with pytest.raises(NotImplementedError, match="all_reduce"):
        _run(body, _x(4, 4))
    for fn, name in ((nisa.core_barrier, "core_barrier"), (nisa.sendrecv, "sendrecv")):
        with pytest.raises(NotImplementedError, match=name):
            _run(lambda t, fn=fn: fn(nl.load(t), (0, 1)), _x(4, 4))


def test_dma_transpose():
    a = _x(16, 64).astype(np.float16)

    @nki.jit
    def k(t):
        out = nl.ndarray((64, 16), t.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((64, 16), t.dtype)
        nisa.dma_transpose(s, t)
        nl.store(out, s)
        return out

    np.testing.assert_array_equal(k(a), a.T)


def test_tensor_tensor_scan():
    a, b = _x(32, 40), _x(32, 40)
    init = _x(32, 1)

    def body(ta, tb, ti):
        return nisa.tensor_tensor_scan(
            nl.ndarray((32, 40), nl.float32), nl.load(ta), nl.load(tb), nl.load(ti), nl.multiply, nl.add
        )

    ref = np.empty_like(a)
    prev = init[:, 0]
    for i in range(40):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(_run(body, a, b, init), ref, rtol=1e-5, atol=1e-5)


def test_tensor_scalar_reduce_with_accumulator_commands():
    a = _x(64, 30)

    def body(t):
        x = nl.load(t)
        out = nl.ndarray((64, 30), nl.float32)
        r1 = nl.ndarray((64, 1), nl.float32)
        nisa.tensor_scalar_reduce(out, x, nl.multiply, 2.0, nl.add, r1)
        r2 = nl.ndarray((64, 1), nl.float32)
        nisa.tensor_scalar_reduce(
            nl.ndarray((64, 30), nl.float32), x, nl.add, 1.0, nl.add, r2, reduce_cmd=nisa.reduce_cmd.reduce
        )
        return out, r1, r2

    out, r1, r2 = _run(body, a)
    np.testing.assert_allclose(out, 2 * a)
    np.testing.assert_allclose(r1[:, 0], 2 * a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r2[:, 0], 2 * a.sum(1) + (a + 1).sum(1), rtol=1e-5, atol=1e-4)


def test_predicated_and_dynamic_copies():
    a, b = _x(32, 16), _x(32, 16)
    pred = (RNG.random((32, 16)) > 0.5).astype(np.uint8)

    def body(ta, tb, tp):
        d = nl.load(ta)
        nisa.tensor_copy_predicated(dst=d, src=nl.load(tb), predicate=nl.load(tp))
        e = nl.load(ta)
        nisa.tensor_copy_predicated(e, 7.0, nl.load(tp), reverse_pred=True)
        f = nl.ndarray((32, 16), nl.float32)
        nisa.tensor_copy_dynamic_src(f, nl.load(tb))
        g = nl.ndarray((32, 16), nl.float32)
        nisa.tensor_copy_dynamic_dst(dst=g, src=nl.load(ta))
        return d, e, f, g

    d, e, f, g = _run(body, a, b, pred)
    np.testing.assert_array_equal(d, np.where(pred, b, a))
    np.testing.assert_array_equal(e, np.where(pred, a, 7.0))
    np.testing.assert_array_equal(f, b)
    np.testing.assert_array_equal(g, a)


def test_range_select_and_select_reduce():
    a = _x(16, 64)
    lo = RNG.integers(0, 30, (16, 1)).astype(np.float32)
    hi = lo + 20

    def body(ta, tl, th):
        x = nl.load(ta)
        rr = nl.ndarray((16, 1), nl.float32)
        out = nisa.range_select(
            nl.ndarray((16, 64), nl.float32), x, nl.greater_equal, nl.less, nl.load(tl), nl.load(th), reduce_res=rr
        )
        pr = nl.greater(x, 0.0, dtype=nl.uint8)
        sr = nl.ndarray((16, 1), nl.float32)
        sel = nisa.select_reduce(
            nl.ndarray((16, 64), nl.float32), pr, x, -1.0, reduce_res=sr, reduce_cmd=nisa.reduce_cmd.reset_reduce
        )
        return out, rr, sel, sr

    out, rr, sel, sr = _run(body, a, lo, hi)
    idx = np.arange(64)[None, :]
    keep = (idx >= lo) & (idx < hi)
    ref = np.where(keep, a, np.finfo(np.float32).min)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(rr[:, 0], ref.max(1))
    ref2 = np.where(a > 0, a, -1.0)
    np.testing.assert_array_equal(sel, ref2)
    np.testing.assert_array_equal(sr[:, 0], ref2.max(1))


def test_max8_find_index8_match_replace8():
    a = RNG.permutation(np.arange(16 * 40, dtype=np.float32)).reshape(16, 40)

    def body(t):
        x = nl.load(t)
        top = nisa.max8(nl.ndarray((16, 8), nl.float32), x)
        idx = nisa.nc_find_index8(nl.ndarray((16, 8), nl.uint32), x, top)
        rep_idx = nl.ndarray((16, 8), nl.uint32)
        rep = nisa.nc_match_replace8(nl.ndarray((16, 40), nl.float32), x, top, -1.0, dst_idx=rep_idx)
        return top, idx, rep, rep_idx

    top, idx, rep, rep_idx = _run(body, a)
    ref_top = -np.sort(-a, 1)[:, :8]
    np.testing.assert_array_equal(top, ref_top)
    ref_idx = np.argsort(-a, 1)[:, :8]
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(rep_idx, ref_idx)
    ref_rep = a.copy()
    np.put_along_axis(ref_rep, ref_idx, -1.0, 1)
    np.testing.assert_array_equal(rep, ref_rep)


def test_find_index8_duplicates_and_missing():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 5]], np.float32)
    idx = _run(lambda d, v: nisa.nc_find_index8(nl.load(d), nl.load(v)), data, vals)
    np.testing.assert_array_equal(idx, [[2, 4, 5, 6, 7, 8, 9, 0xFFFFFFFF]])


def test_local_gather():
    src = _x(32, 64, 2)
    per_core = RNG.integers(0, 64, (16, 3)).astype(np.uint16)
    index = np.tile(per_core, (2, 1)) * 2  # element offsets, 2 elements per index

    def body(ts, ti):
        return nisa.local_gather(nl.load(ts), nl.load(ti), num_elem_per_idx=2)

    out = _run(body, src, index)
    # [P, index free (3), 16 partitions of a GpSimd core, elements per index]
    assert out.shape == (32, 3, 16, 2)
    out = out.reshape(32, 48, 2)
    ref = np.empty((32, 48, 2), np.float32)
    for c in range(2):
        rows = slice(16 * c, 16 * c + 16)
        ids = np.tile(per_core, (2, 1))[rows].flatten(order="F")
        ref[rows] = np.take(src[rows], ids, axis=1)
    np.testing.assert_array_equal(out, ref)


def test_nc_stream_shuffle():
    a = _x(64, 8)
    mask = [31 - i for i in range(32)]
    mask[5] = 255

    def body(t):
        dst = nl.zeros((64, 8), nl.float32)
        nisa.nc_stream_shuffle(dst, nl.load(t), mask)
        return dst

    out = _run(body, a)
    for q in (0, 32):
        for i, m in enumerate(mask):
            np.testing.assert_array_equal(out[q + i], 0 if m == 255 else a[q + m])


# ----- 7/9. targets and the device boundary --------------------------------------------------
def test_default_target_follows_instance_type(monkeypatch):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    monkeypatch.setenv("TORCH_NEURONX_INSTANCE_TYPE", "trn3.3xlarge")
    k(_x(4, 4))
    assert k.cost_report().hardware == "trn3"
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE_TYPE", "trn1.2xlarge")
    with pytest.raises(NotImplementedError, match="trn1"):
        k(_x(4, 4))
    with pytest.raises(NotImplementedError, match="trn1"):
        nki.simulate(k, platform_target="trn1")(_x(4, 4))


def test_kernel_arguments_must_share_a_device():
    import torch

    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    x = torch.randn(8, 8)
    msg = "Expected all tensors to be on the same device, but found at least two devices"
    with pytest.raises(RuntimeError, match=msg):
        k(x.to("neuron"), x)
    if torch.neuron.device_count() > 1:
        with pytest.raises(RuntimeError, match=msg):
            k(x.to("neuron:0"), x.to("neuron:1"))
    assert torch.equal(k(x.to("neuron:0"), x.to("neuron:0")).cpu(), x + x)


def test_dma_copy_read_modify_write_and_oob_skip():
    a = _x(8, 16)
    idx = np.array([[0], [2], [4], [40], [6], [8], [-1], [10]], np.int32)

    @nki.jit
    def k(t, ti):
        out = nl.ndarray((16, 16), t.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.full((16, 16), 1.0, nl.float32))
        i_f = nl.arange(16)[None, :]
        nisa.dma_copy(dst=out[nl.load(ti), i_f], src=nl.load(t), dst_rmw_op=np.add, oob_mode=nisa.oob_mode.skip)
        return out

    ref = np.ones((16, 16), np.float32)
    for r, i in enumerate(idx[:, 0]):
        if 0 <= i < 16:
            ref[i] += a[r]
    np.testing.assert_allclose(k(a, idx), ref, rtol=1e-6)
    with pytest.raises(IndexError, match="out of bounds"):
        _oob_error_kernel(a, idx)  # the default oob_mode raises


@nki.jit
def _oob_error_kernel(t, ti):
    out = nl.ndarray((16, 16), t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[nl.load(ti), nl.arange(16)[None, :]], src=nl.load(t))
    return out
