"""torch.autocast("neuron") follows CUDA's op policy."""

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_policy(dtype):
    a = torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron", dtype=dtype):
        assert torch.mm(a, a).dtype == dtype  # lower precision
        assert torch.nn.functional.linear(a, a).dtype == dtype
        assert torch.softmax(a, -1).dtype == torch.float32  # fp32 list
        assert torch.sum(a.to(dtype)).dtype == torch.float32  # fp32_set_opt_dtype
        assert torch.addcmul(a, a.to(dtype), a).dtype == torch.float32  # promote
        assert (a + a).dtype == torch.float32  # untouched


def test_autocast_matches_cpu_numerics():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = m(x)
    mn = m.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = mn(x.to("neuron"))
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), ref)


def test_autocast_backward():
    m = torch.nn.Linear(8, 8).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss = m(torch.randn(2, 8, device="neuron")).float().pow(2).mean()
    loss.backward()
    assert m.weight.grad.dtype == torch.float32


def test_binary_cross_entropy_banned_like_cuda():
    p = torch.rand(4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="unsafe to autocast"):
        torch.nn.functional.binary_cross_entropy(p, p)
