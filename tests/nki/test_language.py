"""Semantics of nki.language / nki.isa in the simulator, checked against NumPy/torch."""

import linecache

import numpy as np
import pytest
import torch

import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from helpers import run_python
from torch_neuronx import nki

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_grid_program_ids_and_shared_output():
    @nki.jit
    def k(a):
        out = nl.ndarray((nl.num_programs(0), nl.num_programs(1)), nl.float32, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        nl.store(out[i : i + 1, j : j + 1], nl.full((1, 1), 10 * i + j + a.shape[0], nl.float32))
        return out

    out = k[2, 3](np.zeros((5, 1), np.float32))
    np.testing.assert_array_equal(out, 5 + np.array([[0, 1, 2], [10, 11, 12]]))
    assert k.cost_report().n_programs == 6


def test_legacy_output_argument_is_written_back():
    @nki.jit
    def k(a, out):
        nl.store(out, nl.multiply(nl.load(a), 2.0))

    a = torch.randn(64, 32)
    for dev in ("cpu", "neuron"):
        out = torch.zeros(64, 32, device=dev)
        assert k(a.to(dev), out) is None
        assert torch.equal(out.cpu(), a * 2)
    out_np = np.zeros((64, 32), np.float32)
    k(a.numpy(), out_np)
    np.testing.assert_array_equal(out_np, a.numpy() * 2)


def test_multiple_outputs_and_scalar_args():
    @nki.jit
    def k(a, alpha, flag=False):
        o1 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(o1, nl.multiply(t, alpha))
        nl.store(o2, nl.max(t, axis=1, keepdims=True) if flag else nl.sum(t, axis=1, keepdims=True))
        return o1, o2

    a = _x(16, 40)
    o1, o2 = k(a, 3.0, flag=True)
    np.testing.assert_allclose(o1, a * 3, rtol=1e-6)
    np.testing.assert_allclose(o2[:, 0], a.max(axis=1))


def test_bf16_rounding_matches_torch():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a, dtype=nl.bfloat16))
        return out

    a = torch.randn(8, 300)
    assert torch.equal(k(a), a.bfloat16())


def test_isa_ops_against_numpy():
    a, b = _x(128, 96), _x(128, 96)
    col = _x(128, 1)

    @nki.jit
    def k(a, b, col):
        ta, tb, tc = nl.load(a), nl.load(b), nl.load(col)
        outs = []
        outs.append(nisa.activation(op=nl.tanh, data=ta, bias=tc, scale=0.5))
        red = nl.ndarray((128, 1), nl.float32)
        outs.append(nisa.activation(op=nl.exp, data=ta, reduce_op=nl.add, reduce_res=red))
        outs.append(red)
        outs.append(nisa.tensor_tensor(ta, tb, op=nl.maximum))
        outs.append(nisa.tensor_scalar(ta, op0=nl.subtract, operand0=tc, reverse0=True, op1=nl.multiply, operand1=3.0))
        outs.append(nisa.tensor_reduce(nl.maximum, ta, axis=1, keepdims=True, negate=True))
        outs.append(nisa.tensor_reduce(nl.sum, ta, axis=1, keepdims=True))
        outs.append(nisa.tensor_reduce(np.max, ta, axis=(1,), keepdims=True))
        outs.append(nisa.scalar_tensor_tensor(ta, op0=nl.multiply, operand0=tc, op1=nl.add, operand1=tb))
        outs.append(nisa.tensor_copy(nisa.nc_transpose(ta)))
        outs.append(nisa.nc_transpose(ta[0:32, 0:32], engine=nisa.engine.vector))
        outs.append(nisa.iota(nl.arange(128)[:, None] * 3 + nl.arange(96)[None, :], nl.int32))
        outs.append(nisa.memset((128, 96), 7.5, nl.float32))
        outs.append(nisa.tensor_partition_reduce(nl.add, ta))
        outs.append(nl.where(ta > tb, ta, tb))
        ip, jf = nl.mgrid[0:128, 0:96]
        outs.append(nisa.affine_select(ip >= jf, ta, -1.0))
        res = []
        for i, t in enumerate(outs):
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm, name=f"o{i}")
            src = nl.copy(t) if t.buffer == nl.psum else t
            nl.store(o, src)
            res.append(o)
        return tuple(res)

    got = k(a, b, col)
    i_p, j_f = np.arange(128)[:, None], np.arange(96)[None, :]
    want = [
        np.tanh(a * 0.5 + col),
        np.exp(a),
        np.exp(a).sum(1, keepdims=True),
        np.maximum(a, b),
        (col - a) * 3,
        -a.max(1, keepdims=True),
        a.sum(1, keepdims=True),
        a.max(1, keepdims=True),
        a * col + b,
        a.T,
        a[0:32, 0:32].T,
        i_p * 3 + j_f,
        np.full((128, 96), 7.5),
        a.sum(0, keepdims=True),
        np.where(a > b, a, b),
        np.where(i_p >= j_f, a, -1.0),
    ]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6, err_msg=f"output {i}")


def test_bn_stats_aggr_and_dma_copy():
    a = _x(64, 1000) * 3 + 2

    @nki.jit
    def k(a):
        out = nl.ndarray((64, 2), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 1000), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        stats = nl.ndarray((64, 12), nl.float32)
        stats[:, 0:6] = nisa.bn_stats(t[:, 0:512])
        stats[:, 6:12] = nisa.bn_stats(t[:, 512:1000])
        nisa.dma_copy(dst=out, src=nisa.bn_aggr(stats))
        return out

    got = k(a)
    np.testing.assert_allclose(got[:, 0], a.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 1], a.var(1), rtol=1e-4)


def test_nc_matmul_dst_accumulates_over_k():
    lhsT, rhs = _x(256, 64), _x(256, 200)

    @nki.jit
    def k(lhsT, rhs):
        out = nl.ndarray((64, 200), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((64, 200), nl.float32, buffer=nl.psum)
        for kk in nl.affine_range(2):
            nisa.nc_matmul(
                nl.load(lhsT[kk * 128 : (kk + 1) * 128, :]), nl.load(rhs[kk * 128 : (kk + 1) * 128, :]), dst=acc
            )
        nl.store(out, nl.copy(acc))
        return out

    np.testing.assert_allclose(k(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


def test_sequential_range_loop_carried_and_operators():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 8), nl.float32)
        for i in nl.sequential_range(a.shape[1] // 8):
            t = nl.load(a[:, i * 8 : (i + 1) * 8])
            acc[...] = acc * 0.5 + (-t) / 2 - 1
        nl.store(out, acc)
        return out

    a = _x(128, 32)
    want = np.zeros((128, 8), np.float32)
    for i in range(4):
        want = want * 0.5 + (-a[:, i * 8 : (i + 1) * 8]) / 2 - 1
    np.testing.assert_allclose(k(a), want, rtol=1e-6, atol=1e-6)


def test_par_dim_block_allocation():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((2, nl.par_dim(128), 16), nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(2):
            buf[i] = nl.load(a[i * 128 : (i + 1) * 128, :])
        for i in nl.affine_range(2):
            nl.store(out[i * 128 : (i + 1) * 128, :], nl.exp(buf[i]))
        return out

    a = _x(256, 16)
    np.testing.assert_allclose(k(a), np.exp(a), rtol=1e-6)


def test_nki_import_alias():
    r = run_python(
        "import torch, torch_neuronx.nki as tnki, neuronsim.nki as real\n"
        "import nki, nki.language as nl, nki.isa as nisa\n"
        "import neuronxcc.nki.language as nl2, torch_neuronx.nki.language as nl3\n"
        "assert nki is real is tnki and nl is real.language and nisa is real.isa and nl2 is nl is nl3\n"
        "assert real.language.__spec__.name == 'neuronsim.nki.language'\n"
        "@nki.jit\n"
        "def k(a):\n"
        "    o = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(o, nl.add(nl.load(a), 1.0))\n"
        "    return o\n"
        "print(k(torch.zeros(2, 2)).sum().item())\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4.0"


def test_kernel_called_from_kernel_is_inlined():
    @nki.jit
    def double(t):
        return nl.multiply(t, 2.0)

    @nki.jit
    def outer(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, double(nl.load(a)))
        return out

    a = _x(8, 8)
    np.testing.assert_array_equal(outer(a), a * 2)
    assert outer.cost_report().instructions["Vector"] == 1


@pytest.mark.parametrize("bad", ["trn9", "inf2"])
def test_unknown_platform_target(bad):
    with pytest.raises(ValueError, match="unknown platform_target"):
        nki.get_hardware(bad)


def test_loop_reduce_accumulates_into_the_assigned_tile():
    @nki.jit
    def k(a):
        n_outer, n_inner = a.shape[0], a.shape[1]
        out = nl.ndarray((n_outer, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        for o in nl.affine_range(n_outer):
            s = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
            m = nl.full((128, 64), -3.0, dtype=nl.float32, buffer=nl.sbuf)
            for i in nl.affine_range(n_inner):
                t = nl.load(a[o, i])
                s = nl.loop_reduce(t, op=np.add, loop_indices=[i], dtype=nl.float32)
                m = nl.loop_reduce(
                    t,
                    nl.maximum,
                    (o, i),
                )
            nl.store(out[o], nl.subtract(s, m))
        return out

    a = _x(2, 3, 128, 64)
    # m starts at -3.0 (its tile before the loop), so values below it never win
    np.testing.assert_allclose(k(a), a.sum(1) - np.maximum(a.max(1), -3.0), rtol=1e-6, atol=1e-6)


def test_loop_reduce_into_a_subscript_across_k_blocks():
    # the blocked-matmul pattern: each K block accumulates in PSUM, then loop_reduce adds
    # the block into its slice of an SBUF accumulator
    @nki.jit
    def k(lhsT, rhs):
        n_kb, kb, m = lhsT.shape[0] // 256, 2, lhsT.shape[1]
        n = rhs.shape[1]
        out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
        z = nl.zeros((2, nl.par_dim(m), n // 2), dtype=nl.float32, buffer=nl.sbuf)
        for k2 in nl.affine_range(n_kb):
            for j in nl.affine_range(2):
                acc = nl.zeros((m, n // 2), dtype=nl.float32, buffer=nl.psum)
                for k1 in nl.affine_range(kb):
                    r0 = (k2 * kb + k1) * 128
                    a_t = nl.load(lhsT[r0 : r0 + 128, :])
                    b_t = nl.load(rhs[r0 : r0 + 128, j * (n // 2) : (j + 1) * (n // 2)])
                    acc += nisa.nc_matmul(a_t, b_t)
                z[j, :, :] = nl.loop_reduce(acc, op=np.add, loop_indices=[k2], dtype=nl.float32)
        for j in nl.affine_range(2):
            nl.store(out[:, j * (n // 2) : (j + 1) * (n // 2)], z[j])
        return out

    lhsT, rhs = _x(768, 64), _x(768, 256)
    np.testing.assert_allclose(k(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "body, exc, match",
    [
        ("b = nl.loop_reduce(t, np.subtract, [0])", NotImplementedError, "only commutative operators"),
        ("nl.store(out, nl.loop_reduce(t, np.add, [0]))", NotImplementedError, "assignment the call"),
        ("c = nl.loop_reduce(t, np.add, [0])", TypeError, "destination 'c' must hold the accumulator tile"),
        ("b = nl.loop_reduce(t, np.add, ['i'])", TypeError, "loop_indices must be loop indices"),
    ],
)
def test_loop_reduce_errors(body, exc, match):
    src = (
        "def k(a):\n"
        "    out = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)\n"
        "    t = nl.load(a)\n"
        "    b = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)\n"
        f"    {body}\n"
        "    return out\n"
    )
    ns = {"nl": nl, "np": np}
    filename = f"<loop_reduce_errors {body}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # as IPython does
    exec(compile(src, filename, "exec"), ns)
    with pytest.raises(exc, match=match):
        nki.simulate_kernel(ns["k"], np.zeros((8, 8), np.float32))


def test_access_patterns_read_and_write():
    @nki.jit
    def k(a):
        p, f = a.shape
        out = nl.ndarray((p, 3, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        rows = nl.ndarray((p // 2, f // 2), dtype=nl.float32, buffer=nl.shared_hbm)
        scattered = nl.ndarray((2 * p, f), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        s = nl.ndarray((p, 3, 4), dtype=nl.float32, buffer=nl.sbuf)
        # SBUF: each partition's 12 elements read as [4, 3] and written as [3, 4]
        nisa.tensor_copy(dst=s, src=t.ap(pattern=[[f, p], [1, 3], [3, 4]], offset=0))
        nl.store(out, s)
        # HBM source: odd rows, even columns
        nisa.dma_copy(dst=rows, src=a.ap(pattern=[[2 * f, p // 2], [2, f // 2]], offset=f))
        # HBM destination: every other row of a taller tensor (the rest is written next)
        nisa.dma_copy(dst=scattered.ap(pattern=[[2 * f, p], [1, f]], offset=0), src=t)
        nisa.dma_copy(dst=scattered.ap(pattern=[[2 * f, p], [1, f]], offset=f), src=nl.negative(t))
        return out, rows, scattered

    a = _x(8, 12)
    out, rows, scattered = k(a)
    np.testing.assert_array_equal(out, a.reshape(8, 4, 3).transpose(0, 2, 1))
    np.testing.assert_array_equal(rows, a[1::2, 0::2])
    np.testing.assert_array_equal(scattered[0::2], a)
    np.testing.assert_array_equal(scattered[1::2], -a)


def test_access_pattern_pooling_view():
    # the average-pool tutorial's 5-D window view of a [C, H, W] tile, reduced over the window
    @nki.jit
    def pool(x, k):
        c, h, w = x.shape
        out = nl.ndarray((c, h // k, w // k), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((c, h, w), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        windows = t.ap([[h * w, c], [k * w, h // k], [k, w // k], [w, k], [1, k]])
        s = nl.sum(windows, axis=[3, 4])
        r = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=s, op0=nl.multiply, operand0=1.0 / (k * k))
        nisa.dma_copy(dst=out, src=r)
        return out

    x = _x(16, 12, 8)
    np.testing.assert_allclose(pool(x, 2), x.reshape(16, 6, 2, 4, 2).mean(axis=(2, 4)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "expr, exc, match",
    [
        ("t.ap(pattern=[[12, 4], [1, 13]])", nki.NKIShapeError, "stay inside a partition"),
        ("t.ap(pattern=[[6, 8], [1, 6]])", nki.NKIShapeError, "step whole partitions"),
        ("a.ap(pattern=[[12, 8], [1, 12]], offset=1)", nki.NKIIndexError, "reaches element 96"),
        ("a.ap(pattern=[[12, 8], [1, 12]], scalar_offset=t)", NotImplementedError, "scalar_offset= .* not simulated"),
        ("a.ap(pattern=[[12, 8], [1, 12]], dtype=nl.bfloat16)", NotImplementedError, "dtype="),
    ],
)
def test_access_pattern_errors(expr, exc, match):
    @nki.jit
    def k(a):
        eval(expr, {"nl": nl}, {"a": a, "t": nl.load(a)})  # noqa: S307 (the parametrised access pattern)

    with pytest.raises(exc, match=match):
        k(np.zeros((8, 12), np.float32))
