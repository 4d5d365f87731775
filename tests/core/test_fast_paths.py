"""The unboxed fast paths (add/sub/mul/div, reductions, activations, matmuls,
...), the recycled CPU aliases and in-place result adoption must behave exactly
like the boxed fallback, i.e. like CPU."""

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
    # Integer div can meet 0 / 0: NaN on both devices.
    torch.testing.assert_close(op(an, bn).cpu(), op(a, b), rtol=0, atol=0, equal_nan=True)
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
    torch.testing.assert_close(acn.cpu(), ac, rtol=0, atol=0, equal_nan=True)


def test_unary_and_matmul_family():
    a, an = _pair(5, 7)
    b, bn = _pair(7, 3)
    c, cn = _pair(5, 3)
    assert torch.equal(torch.neg(an).cpu(), torch.neg(a))
    assert torch.equal(torch.exp(an).cpu(), torch.exp(a))
    assert torch.equal(torch.mm(an, bn).cpu(), torch.mm(a, b))
    assert torch.equal(torch.addmm(cn, an, bn, beta=0.5, alpha=2).cpu(), torch.addmm(c, a, b, beta=0.5, alpha=2))
    assert torch.equal(
        torch.bmm(an[None].expand(2, 5, 7), bn[None].expand(2, 7, 3)).cpu(),
        torch.bmm(a[None].expand(2, 5, 7), b[None].expand(2, 7, 3)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reductions_and_activations(dtype):
    a, an = _pair(4, 6, dtype=dtype)
    cases = [
        lambda t: t.sum(),
        lambda t: t.sum(1, keepdim=True),
        lambda t: t.sum(0, dtype=torch.float32),
        lambda t: t.mean(-1),
        lambda t: torch.softmax(t, 1),
        lambda t: torch.log_softmax(t, 0),
        lambda t: torch.nn.functional.gelu(t),
        lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        torch.nn.functional.silu,
        torch.tanh,
        torch.sigmoid,
        lambda t: torch.rsqrt(t.abs() + 1),
        lambda t: t.pow(2),
        lambda t: torch.where(t > 0, t, t * 3),
        lambda t: t.t().clone(),
        lambda t: t.clone(memory_format=torch.contiguous_format).t(),
        lambda t: t.index_select(1, torch.tensor([0, 5, 2], device=t.device)),
    ]
    for i, f in enumerate(cases):
        got, want = f(an), f(a)
        assert got.device.type == N, i
        assert got.stride() == want.stride(), i
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=f"case {i}")


def test_cat_lists_of_any_length_and_shared_storages():
    xs = [torch.randn(2, i + 1) for i in range(12)]  # more tensors than the inline alias capacity
    xns = [x.to(N) for x in xs]
    assert torch.equal(torch.cat(xns, 1).cpu(), torch.cat(xs, 1))
    a, an = _pair(3, 4)
    assert torch.equal(torch.cat([an, an[1:], an.t().t()]).cpu(), torch.cat([a, a[1:], a]))
    assert torch.equal(torch.cat([an, torch.empty(0, device=N)]).cpu(), torch.cat([a, torch.empty(0)]))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([an, a])
    an2 = an.clone()
    torch.cat([an2, an2], out=torch.empty(0, device=N))  # out= still takes the boxed path
    assert torch.equal(an2.cpu(), a)


def test_recycled_aliases_take_each_argument_s_metadata():
    # One pool of CPU aliases serves ops of every dtype, shape, offset and flag in turn.
    x = torch.randn(6, 8)
    xn = x.to(N)
    ints, intsn = _pair(3, 5, dtype=torch.int64)
    z = torch.randn(4, dtype=torch.complex64)
    zn = z.to(N)
    for _ in range(3):
        for f in (
            lambda t, i, c: t[1:4, 2:6] * t[2:5, 1:5],
            lambda t, i, c: i[1:] + i[:2],
            lambda t, i, c: t.t()[3:] - 1,
            lambda t, i, c: (c.conj() * 2).resolve_conj(),
            lambda t, i, c: t.add_(t).div_(2),
            lambda t, i, c: t.view(8, 6).sum(0),
        ):
            got, want = f(xn, intsn, zn), f(x, ints, z)
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert torch.equal(xn.cpu(), x)


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
