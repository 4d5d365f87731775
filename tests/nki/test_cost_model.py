"""Cost model against hand-computed estimates from the published figures."""

import numpy as np
import pytest
import torch

import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx import nki
from torch_neuronx.nki.kernels import rmsnorm

# Published figures (AWS "Trainium2/3 Architecture Guide for NKI"), written out here so
# the test does not read them back from the module under test.
TENSOR_HZ = 2.4e9  # one moving column per cycle
TRN2_VECTOR_HZ = 0.96e9
TRN2_HBM = 2.9e12 / 8  # bytes/s per NeuronCore (chip HBM / 8 cores)
TRN3_DMA = 16 * 33e9  # trn3: 16 DMA engines of 33 B/ns, below its HBM share (612.5 GB/s)
DMA_FIXED_PER_QUEUE = 1.3e-6 / 16


@nki.jit
def _repeated_matmul(st, mv, reps):
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    s, m = nl.load(st), nl.load(mv)
    acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
    for _ in nl.affine_range(reps):
        acc += nisa.nc_matmul(s, m)
    nl.store(out, nl.copy(acc))
    return out


@nki.jit
def _repeated_matmul_n(st, mv, reps):
    out = nl.ndarray((128, mv.shape[1]), nl.float32, buffer=nl.shared_hbm)
    s, m = nl.load(st), nl.load(mv)
    acc = nl.zeros((128, mv.shape[1]), nl.float32, buffer=nl.psum)
    for _ in nl.affine_range(reps):
        acc += nisa.nc_matmul(s, m)
    nl.store(out, nl.copy(acc))
    return out


def test_matmul_is_compute_bound_with_expected_time():
    st = torch.randn(128, 128, dtype=torch.bfloat16)
    mv = torch.randn(128, 512, dtype=torch.bfloat16)
    out, rep = nki.simulate(_repeated_matmul, report=True)(st, mv, 200)
    torch.testing.assert_close(out, 200 * (st.float().T @ mv.float()), rtol=1e-4, atol=1e-2)
    expected = 200 * 512 / TENSOR_HZ
    assert rep.engine_busy_s["Tensor"] == pytest.approx(expected, rel=1e-9)
    assert rep.bound == "compute (Tensor)"
    assert rep.total_time_s == pytest.approx(expected, rel=1e-9)
    assert rep.instructions["Tensor"] == 200
    assert rep.flops == 200 * 2 * 128 * 128 * 512
    # 512 cycles at 2.4 GHz = 0.2133 us, x200 = 42.67 us: exactly the 79 TFLOPS peak
    assert rep.total_time_us == pytest.approx(42.67, abs=0.01)
    assert rep.flops / rep.total_time_s == pytest.approx(2.4e9 * 128 * 128 * 2, rel=1e-9)
    # fp32 operands run at the published FP32/BF16 ratio (20 vs 79 TFLOPS)
    _, rep32 = nki.simulate(_repeated_matmul, report=True)(st.float(), mv.float(), 200)
    assert rep32.engine_busy_s["Tensor"] == pytest.approx(expected * 79 / 20, rel=1e-9)
    # a short moving tile still occupies the array MM_INIT_LATENCY (64) cycles
    _, rep_small = nki.simulate(_repeated_matmul_n, report=True)(st, mv[:, :16], 10)
    assert rep_small.engine_busy_s["Tensor"] == pytest.approx(10 * 64 / TENSOR_HZ, rel=1e-9)


@nki.jit
def _copy(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[1] // 8192):
        nl.store(out[:, i * 8192 : (i + 1) * 8192], nl.load(a[:, i * 8192 : (i + 1) * 8192]))
    return out


@pytest.mark.parametrize("target,bw", [("trn2", TRN2_HBM), ("trn3", TRN3_DMA)])
def test_large_copy_is_bandwidth_bound(target, bw):
    a = np.ones((128, 32768), np.float32)  # 16 MiB
    out, rep = nki.simulate(_copy, report=True, platform_target=target)(a)
    np.testing.assert_array_equal(out, a)
    nbytes = 2 * a.nbytes
    assert rep.hbm_bytes == nbytes
    n_dma = 2 * 4  # 4 MiB per transfer
    expected = nbytes / bw + n_dma * DMA_FIXED_PER_QUEUE
    assert rep.bound == "memory"
    assert rep.engine_busy_s["DMA"] == pytest.approx(expected, rel=1e-9)
    assert rep.total_time_s == pytest.approx(nbytes / bw, rel=0.02)  # overhead < 2%
    assert rep.engine_busy_s["Tensor"] == 0.0


def test_vector_instruction_cost_and_psum_accumulate_is_free():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), 1.0))
        return out

    _, rep = nki.simulate(k, report=True)(np.zeros((128, 1000), np.float32))
    # fp32 data path: 256 elements/cycle over 128 lanes -> 1000 * 128 / 256 cycles
    assert rep.engine_busy_s["Vector"] == pytest.approx(500 / TRN2_VECTOR_HZ)
    _, rep = nki.simulate(k, report=True)(np.zeros((128, 1000), np.float16))
    # BF16/FP16 input and output: 512 elements/cycle
    assert rep.engine_busy_s["Vector"] == pytest.approx(250 / TRN2_VECTOR_HZ)
    _, rep = nki.simulate(k, report=True)(np.zeros((128, 10), np.float32))
    # short instructions still pay the ~60-cycle SBUF access overhead
    assert rep.engine_busy_s["Vector"] == pytest.approx(60 / TRN2_VECTOR_HZ)
    _, rep = nki.simulate(_repeated_matmul, report=True)(
        np.zeros((128, 128), np.float32), np.zeros((128, 512), np.float32), 3
    )
    # the only Vector work: one PSUM memset and one PSUM->SBUF copy of [128, 512]
    assert rep.instructions["Vector"] == 2


def test_torch_estimate_hand_computed():
    a = torch.randn(1024, 1024, dtype=torch.bfloat16)
    _, rep = nki.estimate_torch(torch.mm, a, a)
    assert [op.name for op in rep.ops] == ["mm"]
    flops = 2 * 1024**3
    assert rep.flops == flops
    assert rep.total_time_s == pytest.approx(flops / 79e12, rel=1e-9)
    assert rep.bound == "compute (Tensor)"

    x = torch.randn(4096, 1024)
    _, rep = nki.estimate_torch(lambda t: t + 1.0, x)
    nbytes = 2 * x.numel() * 4
    assert rep.hbm_bytes == nbytes
    assert rep.total_time_s == pytest.approx(nbytes / TRN2_HBM + DMA_FIXED_PER_QUEUE, rel=1e-9)
    assert rep.bound == "memory"


def test_views_are_free_and_compare_reports_speedup():
    x = torch.randn(512, 512)
    _, rep = nki.estimate_torch(lambda t: t.view(-1).reshape(512, 512).t(), x)
    assert rep.ops == [] and rep.total_time_s == 0.0

    w = torch.randn(512)
    cmp = nki.compare(rmsnorm.nki_rmsnorm, rmsnorm.reference, x, w)
    torch.testing.assert_close(cmp.kernel_output, cmp.torch_output, atol=1e-5, rtol=1e-5)
    assert cmp.speedup == pytest.approx(cmp.torch.total_time_s / cmp.kernel.total_time_s)
    assert cmp.speedup > 1.5  # fused: one HBM round trip instead of one per op
    assert "estimated speedup" in str(cmp)


def test_benchmark_api():
    bench = nki.benchmark(_copy)
    bench(np.ones((128, 8192), np.float32))
    lat = bench.benchmark_result.nc_latency.get_latency_percentile(50)
    assert lat == pytest.approx(bench.benchmark_result.report.total_time_us)
    assert lat > 0


def test_load_into_a_tile_view_is_one_dma_and_no_copy():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 2, 512), nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(2):
            t[:, j, :] = nl.load(a[:, j * 512 : (j + 1) * 512])
        for j in nl.affine_range(2):
            nl.store(out[:, j * 512 : (j + 1) * 512], t[:, j, :])
        return out

    a = np.random.default_rng(0).standard_normal((128, 1024)).astype(np.float32)
    out, rep = nki.simulate(k, report=True)(a)
    np.testing.assert_array_equal(out, a)
    assert rep.instructions["Vector"] == 0 and rep.instructions["DMA"] == 4

    @nki.jit
    def named(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        x = nl.load(a)
        t[...] = x  # assigning a named tile is a real copy
        nl.store(out, t)
        return out

    _, rep = nki.simulate(named, report=True)(a[:, :512])
    assert rep.instructions["Vector"] == 1


def test_dma_is_charged_by_bytes_moved():
    @nki.jit
    def store_bf16(a):
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(a)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.ones((128, 512), np.float32)
    _, rep = nki.simulate(store_bf16, report=True)(a)
    # fp32 HBM read (4 B) + bf16 HBM write (2 B) per element
    assert rep.hbm_bytes == 128 * 512 * (4 + 2)


def test_benchmark_writes_chrome_trace(tmp_path):
    import json

    path = tmp_path / "profile.json"
    bench = nki.benchmark(save_trace_name=str(path), warmup=1, iters=2)(_copy)
    bench(np.ones((128, 8192), np.float32))
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["nl.load", "nl.store"]
    assert spans[1]["ts"] == pytest.approx(spans[0]["dur"])  # one DMA timeline, back to back
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(bench.benchmark_result.nc_latency.get_latency_percentile(50))
    with pytest.raises(TypeError, match="unexpected keyword"):
        nki.benchmark(_copy, save_neff="x")


def test_benchmark_with_save_neff_name_warns_once_and_runs(tmp_path, monkeypatch):
    from neuronsim.nki import _jit

    monkeypatch.setattr(_jit, "_warned_no_neff", False)
    monkeypatch.chdir(tmp_path)
    a = np.ones((128, 8192), np.float32)
    with pytest.warns(UserWarning, match="no NEFF file is written") as caught:
        # the decorator form AWS's tutorials use, then the direct form, then a grid
        bench = nki.benchmark(warmup=2, iters=5, save_neff_name="file.neff", save_trace_name="profile.ntff")(_copy)
        bench(a)
        again = nki.benchmark(_copy, save_neff_name="file.neff")
        again(a)
        nki.benchmark(_copy, save_neff_name="file.neff")[1](a)
    assert len([w for w in caught if "NEFF" in str(w.message)]) == 1
    assert caught[0].filename == __file__  # points at the caller's line
    assert bench.benchmark_result.nc_latency.get_latency_percentile(50) > 0
    assert again.benchmark_result.nc_latency.get_latency_percentile(99) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.ntff"]  # the trace; no NEFF
