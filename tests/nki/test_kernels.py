"""The tutorial kernels match their PyTorch references (simulator, torch cpu, neuron)."""

import numpy as np
import pytest
import torch

from torch_neuronx import nki
from torch_neuronx.nki.kernels import add, attention, layernorm, matmul, rmsnorm, softmax

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def _check(kernel, ref, args, kwargs=None, dtype=torch.float32, tol=None):
    kwargs = kwargs or {}
    expected = ref(*args, **kwargs)
    tol = tol or TOL[dtype]
    # eager on neuron tensors: result comes back on the neuron device
    out = kernel(*[a.to("neuron") for a in args], **kwargs)
    assert out.device.type == "neuron" and out.dtype == expected.dtype
    torch.testing.assert_close(out.cpu(), expected, **tol)
    # simulator on NumPy arrays (float32 inputs only: NumPy has no bfloat16)
    if dtype == torch.float32:
        np_out = nki.simulate(kernel)(*[a.numpy() for a in args], **kwargs)
        assert isinstance(np_out, np.ndarray)
        np.testing.assert_allclose(np_out, expected.numpy(), atol=tol["atol"], rtol=tol["rtol"])


@pytest.mark.parametrize("shape", [(1, 7), (128, 64), (129, 33), (300, 512)])
def test_add(shape):
    a, b = _rand(*shape), _rand(*shape, seed=1)
    _check(add.nki_tensor_add, add.reference, (a, b), tol=dict(atol=0, rtol=0))


def test_add_cpu_bf16_exact():
    a, b = _rand(200, 96, dtype=torch.bfloat16), _rand(200, 96, dtype=torch.bfloat16, seed=2)
    out = add.nki_tensor_add(a, b)
    assert out.device.type == "cpu" and out.dtype == torch.bfloat16
    assert torch.equal(out, a + b)  # fp32 add rounded once to bf16 == torch's bf16 add


@pytest.mark.parametrize(
    "kmn,dtype",
    [
        ((128, 128, 512), torch.float32),
        ((64, 32, 48), torch.float32),
        ((300, 200, 700), torch.float32),
        ((256, 129, 513), torch.float32),
        ((300, 200, 700), torch.bfloat16),
    ],
)
@pytest.mark.parametrize("kernel", [matmul.nki_matmul_tiled, matmul.nki_matmul_hoisted])
def test_matmul(kmn, dtype, kernel):
    k, m, n = kmn
    lhsT, rhs = _rand(k, m, dtype=dtype), _rand(k, n, dtype=dtype, seed=3)
    tol = dict(atol=1e-3, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.25, rtol=2e-2)
    _check(kernel, lambda a, b: (a.float().T @ b.float()).to(dtype), (lhsT, rhs), dtype=dtype, tol=tol)


def test_hoisted_matmul_reads_each_input_once():
    lhsT, rhs = _rand(512, 256, dtype=torch.bfloat16), _rand(512, 1024, dtype=torch.bfloat16)
    _, naive = nki.simulate(matmul.nki_matmul_tiled, report=True)(lhsT, rhs)
    _, hoisted = nki.simulate(matmul.nki_matmul_hoisted, report=True)(lhsT, rhs)
    once = (lhsT.numel() + rhs.numel() + 256 * 1024) * 2
    assert hoisted.hbm_bytes == once < naive.hbm_bytes
    assert hoisted.total_time_s < naive.total_time_s


@pytest.mark.parametrize("shape", [(1, 5), (128, 512), (130, 1000)])
def test_softmax(shape):
    _check(softmax.nki_softmax, softmax.reference, (_rand(*shape) * 3,))


def test_softmax_bf16():
    _check(softmax.nki_softmax, softmax.reference, (_rand(257, 64, dtype=torch.bfloat16),), dtype=torch.bfloat16)


@pytest.mark.parametrize("shape", [(3, 16), (128, 256), (257, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm(shape, dtype):
    x, w = _rand(*shape, dtype=dtype), _rand(shape[1], dtype=dtype, seed=4)
    _check(rmsnorm.nki_rmsnorm, rmsnorm.reference, (x, w), dtype=dtype)


@pytest.mark.parametrize("shape", [(5, 32), (128, 512), (200, 1100)])
def test_layernorm(shape):
    x = _rand(*shape) * 2 + 1
    g, b = _rand(shape[1], seed=5), _rand(shape[1], seed=6)
    _check(layernorm.nki_layernorm, layernorm.reference, (x, g, b), tol=dict(atol=1e-4, rtol=1e-4))


@pytest.mark.parametrize(
    "sq,sk,d,causal",
    [(128, 128, 64, False), (200, 300, 32, False), (64, 513, 128, False), (128, 128, 64, True), (300, 300, 16, True)],
)
def test_attention(sq, sk, d, causal):
    q, k, v = _rand(sq, d), _rand(sk, d, seed=7), _rand(sk, d, seed=8)
    _check(
        attention.fused_attention, attention.reference, (q, k, v), {"causal": causal}, tol=dict(atol=1e-5, rtol=1e-4)
    )


def test_attention_bf16_causal():
    q, k, v = (_rand(256, 64, dtype=torch.bfloat16, seed=s) for s in range(3))
    _check(attention.fused_attention, attention.reference, (q, k, v), {"causal": True}, dtype=torch.bfloat16)
