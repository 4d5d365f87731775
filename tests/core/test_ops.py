"""The CPU-kernel fallback: semantics identical to CPU, PyTorch's errors."""

import pytest
import torch

import torch_neuronx


def same(neuron_tensor, cpu_tensor):
    assert neuron_tensor.device.type == "neuron"
    torch.testing.assert_close(neuron_tensor.cpu(), cpu_tensor, rtol=0, atol=0, equal_nan=True)


def test_mixed_device_error():
    x = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="neuron:1"):
        x + torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.ones(2, 2, device="neuron"), torch.ones(2, 2))
    same(x + torch.tensor(2.0), torch.full((3,), 3.0))  # 0-dim CPU tensors are fine


def test_cpu_index_tensors_allowed_like_cuda():
    x = torch.arange(10.0, device="neuron")
    same(x[torch.tensor([1, 3])], torch.tensor([1.0, 3.0]))
    x[torch.tensor([0, 2])] = 5.0
    same(x[:3], torch.tensor([5.0, 1.0, 5.0]))


def test_views_share_memory():
    x = torch.zeros(4, 4, device="neuron")
    v = x[1:3, ::2]
    v.fill_(1.0)
    t = x.t()
    t[0, 3] = 7.0
    ref = torch.zeros(4, 4)
    ref[1:3, ::2] = 1.0
    ref.t()[0, 3] = 7.0
    same(x, ref)
    assert v._base is x and x.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    u = x.unbind(0)
    assert all(e.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for e in u)


def test_inplace_and_out_variants():
    x = torch.randn(5, device="neuron")
    y = x.clone()
    r = x.mul_(2)
    assert r is x
    same(x, y.cpu() * 2)
    out = torch.empty(0, device="neuron")
    res = torch.add(x, y, out=out)
    assert res is out and out.shape == (5,)
    same(out, x.cpu() + y.cpu())
    outs = (torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron"))
    torch.max(x.view(5, 1), 1, out=outs)
    assert outs[0].shape == (5,)


def test_overlap_checks_like_cpu():
    x = torch.arange(6.0, device="neuron")
    with pytest.raises(RuntimeError, match="(overlap|single memory location)"):
        torch.add(x[:4], 1, out=x[2:6])
    e = torch.ones(1, device="neuron").expand(3)
    with pytest.raises(RuntimeError, match="single memory location"):
        e.add_(1)


def test_copies_between_devices_are_real():
    c = torch.arange(4.0)
    n = c.to("neuron")
    c[0] = 100
    assert n[0].item() == 0
    n1 = n.to("neuron:1")
    n[1] = 50
    assert n1.device.index == 1 and n1[1].item() == 1
    assert n1.untyped_storage().data_ptr() != n.untyped_storage().data_ptr()
    same(n.to(torch.float16), c.to(torch.float16).clone().fill_(0) + torch.tensor([0, 50, 2, 3.0]).half())
    t = torch.randn(3, 4)
    same(t.t().to("neuron"), t.t())  # strided host -> device
    assert torch.equal(t.to("neuron").t().cpu(), t.t())  # strided device -> host


def test_conj_and_neg_views():
    z = torch.randn(3, dtype=torch.complex64)
    zn = z.to("neuron")
    same(zn.conj().resolve_conj(), z.conj().resolve_conj())
    same(zn.conj().neg().resolve_neg().resolve_conj(), z.conj().neg().resolve_neg().resolve_conj())
    same(zn.conj().clone(), z.conj().clone())


def test_factories_with_device_argument():
    same(torch.arange(5, device="neuron"), torch.arange(5))
    same(torch.eye(3, device="neuron"), torch.eye(3))
    same(torch.tril_indices(3, 3, device="neuron"), torch.tril_indices(3, 3))
    same(torch.full((2,), 7, device="neuron"), torch.full((2,), 7))
    same(torch.linspace(0, 1, 5, device="neuron"), torch.linspace(0, 1, 5))


def test_layer_norm_uses_cpu_kernel_numerics():
    x = torch.randn(4, 33)
    w, b = torch.randn(33), torch.randn(33)
    same(
        torch.nn.functional.layer_norm(x.to("neuron"), (33,), w.to("neuron"), b.to("neuron")),
        torch.nn.functional.layer_norm(x, (33,), w, b),
    )
    same(
        torch.nn.functional.group_norm(x.view(4, 33, 1).to("neuron"), 3),
        torch.nn.functional.group_norm(x.view(4, 33, 1), 3),
    )


def test_convolution_forward_backward():
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_()
    wn = w.detach().to("neuron").requires_grad_()
    y = torch.nn.functional.conv2d(x, w, padding=1)
    yn = torch.nn.functional.conv2d(xn, wn, padding=1)
    same(yn, y.detach())
    y.sum().backward()
    yn.sum().backward()
    same(xn.grad, x.grad)
    same(wn.grad, w.grad)


def test_sdpa_takes_cpu_flash_kernel():
    q = torch.randn(2, 4, 16, 8)
    torch_neuronx.clear_op_tracking()
    out = torch.nn.functional.scaled_dot_product_attention(*(t.to("neuron") for t in (q, q, q)), is_causal=True)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in torch_neuronx.get_executed_ops()
    same(out, torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))


def test_sdpa_mask_requiring_grad_uses_math_like_cpu():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    mask = torch.zeros(4, 4, requires_grad=True)
    qn = q.detach().to("neuron").requires_grad_()
    maskn = mask.detach().to("neuron").requires_grad_()
    out = torch.nn.functional.scaled_dot_product_attention(qn, qn, qn, attn_mask=maskn)
    out.sum().backward()
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    ref.sum().backward()
    same(maskn.grad, mask.grad)
    same(qn.grad, q.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_forward_and_backward_equal_cpu(dtype):
    # What mixture-of-experts layers run their experts with; an empty group included.
    a = torch.randn(10, 8, dtype=dtype, requires_grad=True)
    b = torch.randn(3, 16, 8, dtype=dtype).transpose(-2, -1).requires_grad_()
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    w = torch.randn(10, 16, dtype=dtype)
    an, bn = (t.detach().to("neuron").requires_grad_() for t in (a, b))
    out = torch._grouped_mm(an, bn, offs=offs.to("neuron"))
    (out * w.to("neuron")).sum().backward()
    ref = torch._grouped_mm(a, b, offs=offs)
    (ref * w).sum().backward()
    same(out, ref.detach())
    same(an.grad, a.grad)
    same(bn.grad, b.grad)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_integer_histc_matches_bincount(dtype):
    torch.manual_seed(0)
    experts = 8
    x = torch.randint(0, experts, (200,), dtype=dtype)
    h = torch.histc(x.to("neuron"), bins=experts, min=0, max=experts - 1)
    assert h.dtype == dtype
    same(h, torch.bincount(x.long(), minlength=experts).to(dtype))
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.histc(x.to("neuron"), bins=experts, min=0, max=experts - 1, out=out)
    same(out, h.cpu())
    f = torch.randn(100)
    same(torch.histc(f.to("neuron"), bins=5), torch.histc(f, bins=5))


def test_efficient_zero_tensor_autograd():
    z = torch._efficientzerotensor(3, device="neuron")
    assert z._is_zerotensor()
    x = torch.randn(3, requires_grad=True, device="neuron")
    torch.sgn(x).sum().backward()
    same(x.grad, torch.zeros(3))


def test_sparse_gives_clear_error():
    x = torch.eye(3, device="neuron")
    with pytest.raises(NotImplementedError, match="aten::_to_sparse.*no sparse kernels"):
        x.to_sparse()
    with pytest.raises(NotImplementedError, match="strided"):
        torch.empty(2, 2, device="neuron", layout=torch.sparse_coo)
    dense = torch.eye(3).to_sparse().to_dense().to("neuron")  # documented round trip
    same(dense, torch.eye(3))


def test_tied_parameters_stay_tied_and_data_assignment():
    m = torch.nn.Module()
    m.emb = torch.nn.Embedding(10, 4)
    m.head = torch.nn.Linear(4, 10, bias=False)
    m.head.weight = m.emb.weight
    opt_param = m.emb.weight
    m.to("neuron")
    assert m.head.weight is m.emb.weight is opt_param and opt_param.is_neuron
    p = torch.nn.Parameter(torch.ones(2))
    p.data = p.data.to("neuron")
    assert p.is_neuron


def test_optimizers_match_cpu():
    for kwargs in ({"foreach": False}, {"foreach": True}, {"fused": True}):
        torch.manual_seed(0)
        w = torch.randn(5, 5)
        g = torch.randn(5, 5)
        pc = torch.nn.Parameter(w.clone())
        pn = torch.nn.Parameter(w.clone().to("neuron"))
        oc = torch.optim.AdamW([pc], lr=0.1, **kwargs)
        on = torch.optim.AdamW([pn], lr=0.1, **kwargs)
        for _ in range(3):
            pc.grad, pn.grad = g.clone(), g.clone().to("neuron")
            oc.step()
            on.step()
        same(pn.detach(), pc.detach())


def test_item_and_scalars():
    x = torch.tensor([2.5], device="neuron")
    assert x.item() == 2.5 and float(x) == 2.5
    assert torch.tensor(True, device="neuron").item() is True
    assert bool((x > 1).all())
