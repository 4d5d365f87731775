"""The unboxed fast paths (add/sub/mul/div, neg, exp, mm, bmm, addmm), the
recycled CPU aliases and in-place result adoption must behave exactly like
the boxed fallback, i.e. like CPU."""
import pytest
import torch

N = "neuron"


def _pair(*shape, dtype=torch.float32):
    x = torch.randn(*shape) if dtype.is_floating_point else torch.randint(-5, 5, shape, dtype=dtype)
    return x, x.to(N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_functional_and_inplace(name, dtype):
    a, an = _pair(4, 6, dtype=dtype)
    b, bn = _pair(6, dtype=dtype)  # broadcast
    op = getattr(torch, name)
    torch.testing.assert_close(op(an, bn).cpu(), op(a, b), rtol=0, atol=0)
    torch.testing.assert_close(op(an, 3).cpu(), op(a, 3), rtol=0, atol=0)
    if name == "div" and not dtype.is_floating_point:
        with pytest.raises(RuntimeError, match="result type Float can't be cast"):
            getattr(an, name + "_")(bn)
        return
    # In place through a non-contiguous view: the neuron tensor keeps its identity and metadata.
    ac, acn = a.clone(), an.clone()
    view, viewn = ac.t()[1:4], acn.t()[1:4]
    out = getattr(viewn, name + "_")(bn[:3].unsqueeze(1))
    getattr(view, name + "_")(b[:3].unsqueeze(1))
    assert out is viewn and out.device.type == N and out.stride() == view.stride()
    torch.testing.assert_close(acn.cpu(), ac, rtol=0, atol=0)


def test_unary_and_matmul_family():
    a, an = _pair(5, 7)
    b, bn = _pair(7, 3)
    c, cn = _pair(5, 3)
    assert torch.equal(torch.neg(an).cpu(), torch.neg(a))
    assert torch.equal(torch.exp(an).cpu(), torch.exp(a))
    assert torch.equal(torch.mm(an, bn).cpu(), torch.mm(a, b))
    assert torch.equal(torch.addmm(cn, an, bn, beta=0.5, alpha=2).cpu(), torch.addmm(c, a, b, beta=0.5, alpha=2))
    assert torch.equal(torch.bmm(an[None].expand(2, 5, 7), bn[None].expand(2, 7, 3)).cpu(),
                       torch.bmm(a[None].expand(2, 5, 7), b[None].expand(2, 7, 3)))


def test_errors_match_cpu():
    a, an = _pair(3, 4)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        an + torch.randn(3, 4)
    assert torch.equal((an + torch.tensor(2.0)).cpu(), a + 2)  # 0-dim CPU tensors are allowed, as on CUDA
    with pytest.raises(RuntimeError, match="must match the size"):
        an + torch.randn(5, 4, device=N)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch.ones(3, dtype=torch.long, device=N).add_(torch.ones(3, device=N) * 0.5)
    if torch.neuron.device_count() > 1:
        with pytest.raises(RuntimeError, match="neuron:1, different from other tensors on neuron:0"):
            an.mul(an.to("neuron:1"))


def test_overlap_checks_see_shared_storage():
    x = torch.arange(10.0)
    xn = x.to(N)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(x[:3], 1, out=x[2:5])
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.add(xn[:3], 1, out=xn[2:5])
    xn[5:8].add_(xn[:3])
    x[5:8].add_(x[:3])
    assert torch.equal(xn.cpu(), x)


def test_results_are_device_memory_and_freed():
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    a = torch.randn(256, 256, device=N)
    for _ in range(50):
        r = (a * 2 + a).exp().neg()  # fresh results adopted in place, aliases recycled
    assert r.device.type == N and r.untyped_storage().device.type == N
    assert torch.neuron.memory_allocated() == base + 2 * a.nbytes
    del a, r
    assert torch.neuron.memory_allocated() == base


def test_fast_paths_count_as_executed_ops_and_track_float64():
    import torch_neuronx

    torch_neuronx.clear_op_tracking()
    x = torch.ones(3, dtype=torch.float64, device=N)
    with pytest.warns(UserWarning, match="aten::mul.Tensor' executed via CPU fallback"):
        x * x
    assert torch_neuronx.get_executed_ops()["aten::mul.Tensor"] == 1
    assert "aten::mul.Tensor" in torch_neuronx.get_fallback_ops()


def test_autograd_through_fast_paths():
    a, an = _pair(4, 5)
    w = torch.randn(5, 3, requires_grad=True)
    wn = w.detach().to(N).requires_grad_()
    (a @ w * 2 - 1).exp().sum().backward()
    (an @ wn * 2 - 1).exp().sum().backward()
    assert torch.equal(wn.grad.cpu(), w.grad)


@pytest.mark.parametrize("channels_last", [False, True])
def test_convolution_layout_is_what_the_compiler_predicts(channels_last):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 4, stride=4)
    x = torch.randn(2, 3, 16, 16)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    ref = conv(x)
    cn = conv.to(N)
    y = cn(x.to(N))
    assert y.is_contiguous()
    torch.testing.assert_close(y.cpu(), ref, rtol=0, atol=0)
    compiled = torch.compile(cn, backend=N, fullgraph=True)
    torch.testing.assert_close(compiled(x.to(N)).cpu(), ref, rtol=1e-5, atol=1e-5)
