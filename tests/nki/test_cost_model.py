"""Cost model against hand-computed estimates from the published figures."""

import numpy as np
import pytest
import torch

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import _cost_model as cm
from torch_neuronx.nki.kernels import rmsnorm

TRN2_COLUMN_HZ = 667e12 / 8 / (2 * 128 * 128)  # dense bf16 FLOP/s per core / FLOP per column
TRN2_HBM = 2.9e12 / 8  # bytes/s per NeuronCore
TRN3_HBM = 4.9e12 / 8


@nki.jit
def _repeated_matmul(st, mv, reps):
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    s, m = nl.load(st), nl.load(mv)
    acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
    for _ in nl.affine_range(reps):
        acc += nisa.nc_matmul(s, m)
    nl.store(out, nl.copy(acc))
    return out


def test_matmul_is_compute_bound_with_expected_time():
    st = torch.randn(128, 128, dtype=torch.bfloat16)
    mv = torch.randn(128, 512, dtype=torch.bfloat16)
    out, rep = nki.simulate(_repeated_matmul, report=True)(st, mv, 200)
    torch.testing.assert_close(out, 200 * (st.float().T @ mv.float()), rtol=1e-4, atol=1e-2)
    expected = 200 * (512 + cm.FIXED_OVERHEAD_CYCLES) / TRN2_COLUMN_HZ
    assert rep.engine_busy_s["Tensor"] == pytest.approx(expected, rel=1e-9)
    assert rep.bound == "compute (Tensor)"
    assert rep.total_time_s == pytest.approx(expected, rel=1e-9)
    assert rep.instructions["Tensor"] == 200
    assert rep.flops == 200 * 2 * 128 * 128 * 512
    # 576 cycles at 2.544 GHz = 0.2264 us, x200 = 45.28 us;
    # fp32 operands run at the FP32/BF16 rate ratio (181/667)
    assert rep.total_time_us == pytest.approx(45.28, abs=0.01)
    _, rep32 = nki.simulate(_repeated_matmul, report=True)(st.float(), mv.float(), 200)
    assert rep32.engine_busy_s["Tensor"] == pytest.approx(expected * 667 / 181, rel=1e-9)


@nki.jit
def _copy(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[1] // 8192):
        nl.store(out[:, i * 8192:(i + 1) * 8192], nl.load(a[:, i * 8192:(i + 1) * 8192]))
    return out


@pytest.mark.parametrize("target,bw", [("trn2", TRN2_HBM), ("trn3", TRN3_HBM)])
def test_large_copy_is_bandwidth_bound(target, bw):
    a = np.ones((128, 32768), np.float32)  # 16 MiB
    out, rep = nki.simulate(_copy, report=True, platform_target=target)(a)
    np.testing.assert_array_equal(out, a)
    nbytes = 2 * a.nbytes
    assert rep.hbm_bytes == nbytes
    n_dma = 2 * 4  # 4 MiB per transfer
    expected = nbytes / bw + n_dma * cm.DMA_FIXED_S
    assert rep.bound == "memory"
    assert rep.engine_busy_s["DMA"] == pytest.approx(expected, rel=1e-9)
    assert rep.total_time_s == pytest.approx(nbytes / bw, rel=0.01)  # overhead < 1%
    assert rep.engine_busy_s["Tensor"] == 0.0


def test_vector_instruction_cost_and_psum_accumulate_is_free():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), 1.0))
        return out
    _, rep = nki.simulate(k, report=True)(np.zeros((128, 1000), np.float32))
    assert rep.engine_busy_s["Vector"] == pytest.approx((1000 + 64) / 1.4e9)
    _, rep = nki.simulate(_repeated_matmul, report=True)(
        np.zeros((128, 128), np.float32), np.zeros((128, 512), np.float32), 3)
    # the only Vector work: one PSUM memset and one PSUM->SBUF copy of [128, 512]
    assert rep.instructions["Vector"] == 2


def test_torch_estimate_hand_computed():
    a = torch.randn(1024, 1024, dtype=torch.bfloat16)
    _, rep = nki.estimate_torch(torch.mm, a, a)
    assert [op.name for op in rep.ops] == ["mm"]
    flops = 2 * 1024 ** 3
    assert rep.flops == flops
    assert rep.total_time_s == pytest.approx(flops / (667e12 / 8), rel=1e-9)
    assert rep.bound == "compute (Tensor)"

    x = torch.randn(4096, 1024)
    _, rep = nki.estimate_torch(lambda t: t + 1.0, x)
    nbytes = 2 * x.numel() * 4
    assert rep.hbm_bytes == nbytes
    assert rep.total_time_s == pytest.approx(nbytes / TRN2_HBM + cm.DMA_FIXED_S, rel=1e-9)
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
