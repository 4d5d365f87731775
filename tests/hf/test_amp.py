"""torch.neuron.amp: CUDA-style autocast / GradScaler names delegating to torch.amp("neuron")."""

import pytest
import torch


def _model_and_data(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(device)
    x = torch.randn(16, 8).to(device)
    y = torch.randn(16, 4).to(device)
    return model, x, y


def test_autocast_is_deprecated_alias_of_torch_autocast():
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    with pytest.warns(FutureWarning, match=r"torch\.amp\.autocast\('neuron'"):
        ctx = torch.neuron.amp.autocast(dtype=torch.bfloat16)
    assert isinstance(ctx, torch.autocast) and ctx.device == "neuron"
    with ctx:
        out = a.to("neuron") @ b.to("neuron")
        assert torch.is_autocast_enabled("neuron")
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = a @ b
    assert out.dtype == torch.bfloat16 and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), expected)


def test_autocast_default_dtype_is_float16_like_cuda():
    with pytest.warns(FutureWarning):
        with torch.neuron.amp.autocast():
            out = torch.ones(2, 2, device="neuron") @ torch.ones(2, 2, device="neuron")
    assert out.dtype == torch.float16


def test_custom_fwd_casts_inputs_under_neuron_autocast():
    with pytest.warns(FutureWarning, match="device_type='neuron'"):
        deco = torch.neuron.amp.custom_fwd(cast_inputs=torch.float32)

    class Double(torch.autograd.Function):
        @staticmethod
        @deco
        def forward(ctx, x):
            return x.dtype, x * 2

    with torch.autocast("neuron", dtype=torch.bfloat16):
        dtype, _ = Double.apply(torch.ones(3, device="neuron", dtype=torch.bfloat16))
    assert dtype == torch.float32


def test_grad_scaler_deprecated_name_targets_neuron():
    with pytest.warns(FutureWarning, match=r"torch\.amp\.GradScaler\('neuron'"):
        scaler = torch.neuron.amp.GradScaler(init_scale=256.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler._device == "neuron" and scaler.get_scale() == 256.0


def test_grad_scaler_scales_unscales_and_steps_like_cpu():
    scale = 1024.0
    model, x, y = _model_and_data("neuron")
    ref, xc, yc = _model_and_data("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=scale, growth_interval=1)

    loss = torch.nn.functional.mse_loss(model(x), y)
    scaled = scaler.scale(loss)
    assert scaled.device.type == "neuron"
    torch.testing.assert_close(scaled.cpu(), loss.detach().cpu() * scale)
    scaled.backward()
    torch.testing.assert_close(
        model.weight.grad.cpu(), torch.autograd.grad(torch.nn.functional.mse_loss(ref(xc), yc) * scale, ref.weight)[0]
    )
    scaler.unscale_(opt)

    ref_opt.zero_grad()
    torch.nn.functional.mse_loss(ref(xc), yc).backward()
    torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad)
    scaler.step(opt)
    ref_opt.step()
    scaler.update()
    torch.testing.assert_close(model.weight.detach().cpu(), ref.weight.detach())
    assert scaler.get_scale() == scale * 2.0  # finite step, growth_interval=1


def test_grad_scaler_skips_step_with_inf_grads_and_backs_off():
    model, x, y = _model_and_data("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=1024.0)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    with torch.no_grad():
        model.weight.grad[0, 0] = float("inf")
    assert scaler.step(opt) is None  # skipped
    scaler.update()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)
    assert scaler.get_scale() == 512.0
