"""NKI kernels from PyTorch: eager calls, wrap_nki, nki_op under torch.compile, autograd."""

import pytest
import torch
import torch._dynamo

import torch_neuronx
from torch_neuronx import nki, nki_op, wrap_nki
from torch_neuronx.nki import isa as nisa
from torch_neuronx.nki import language as nl
from torch_neuronx.nki.kernels import nki_rmsnorm, nki_softmax
from torch_neuronx.nki.kernels.rmsnorm import reference as rmsnorm_ref

DEV = "neuron"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # compiled graphs: private cache (tests/conftest.py)


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- #
# Kernels used only here
# --------------------------------------------------------------------------- #


@nki.jit
def _grid_scale_add(a, b, scale=1.0):
    """out = a * scale + b, one 128-row tile per program of a 1-D grid."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    r0, r1 = i * 128, min((i + 1) * 128, a.shape[0])
    x = nl.load(a[r0:r1, :])
    y = nl.load(b[r0:r1, :])
    nl.store(out[r0:r1, :], value=nl.add(nl.multiply(x, scale), y))
    return out


@nki.jit
def _softmax_backward(y, dy):
    """dx = y * (dy - sum(y * dy, axis=-1)): the softmax gradient as a kernel."""
    rows, cols = y.shape
    dx = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range((rows + 127) // 128):
        r0, r1 = t * 128, min((t + 1) * 128, rows)
        y_t = nl.load(y[r0:r1, :], dtype=nl.float32)
        dy_t = nl.load(dy[r0:r1, :], dtype=nl.float32)
        dot = nl.sum(nl.multiply(y_t, dy_t), axis=1, keepdims=True)
        centered = nisa.tensor_scalar(dy_t, op0=nl.subtract, operand0=dot)
        nl.store(dx[r0:r1, :], value=nl.multiply(y_t, centered, dtype=y.dtype))
    return dx


@nki.jit
def _scale_into(x, out, factor=2.0):
    """Older output-argument style: writes ``x * factor`` into ``out``, returns nothing."""
    for t in nl.affine_range((x.shape[0] + 127) // 128):
        r0, r1 = t * 128, min((t + 1) * 128, x.shape[0])
        nl.store(out[r0:r1, :], value=nl.multiply(nl.load(x[r0:r1, :]), factor))


# --------------------------------------------------------------------------- #
# Eager
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("rows", [7, 128, 130])
def test_jit_kernel_eager_on_neuron(rows):
    x = torch.randn(rows, 64)
    w = torch.randn(64)
    out = nki_rmsnorm(x.to(DEV), w.to(DEV))
    assert out.device.type == DEV
    _close(out, rmsnorm_ref(x, w))


@pytest.mark.parametrize("device", ["cpu", DEV])
def test_wrap_nki_eager_and_grid(device):
    a, b = torch.randn(300, 40), torch.randn(300, 40)
    kernel = wrap_nki(_grid_scale_add)
    out = kernel[3](a.to(device), b.to(device), scale=0.5)
    assert out.device.type == device
    _close(out, a * 0.5 + b)
    # Positional constant, default constant, and wrapping a gridded kernel keeps its grid.
    _close(kernel[(3,)](a.to(device), b.to(device), 2.0), a * 2 + b)
    _close(wrap_nki(_grid_scale_add[3])(a.to(device), b.to(device)), a + b)


def test_wrap_nki_argument_errors():
    kernel = wrap_nki(nki_rmsnorm)
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(TypeError, match="missing required argument 'g_tensor'"):
        kernel(x)
    with pytest.raises(TypeError, match="unexpected argument 'epsilon'"):
        kernel(x, torch.ones(8, device=DEV), epsilon=1e-3)
    with pytest.raises(TypeError, match="expects an @nki.jit kernel"):
        wrap_nki(42)
    with pytest.raises(ValueError, match="at least one tensor"):
        kernel(None, None)


# --------------------------------------------------------------------------- #
# torch.compile
# --------------------------------------------------------------------------- #


def _count_kernel_calls(fn, *args):
    """Run ``fn`` through Dynamo and count nki::kernel_call nodes in the captured graphs."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return sum(
        1 for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and "nki.kernel_call" in str(n.target)
    )


@pytest.mark.parametrize("rows", [64, 130])
def test_wrap_nki_in_compiled_graph(rows):
    x, w = torch.randn(rows, 32), torch.randn(32)
    rms = wrap_nki(nki_rmsnorm)

    def f(x, w):
        return rms(x * 2, w, eps=1e-5).relu() + 1

    assert _count_kernel_calls(f, x, w) == 1
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    out = compiled(x.to(DEV), w.to(DEV))
    assert out.device.type == DEV
    _close(out, rmsnorm_ref(x * 2, w, 1e-5).relu() + 1)


def test_wrap_nki_called_inside_compiled_function_with_grid():
    a, b = torch.randn(256, 16), torch.randn(256, 16)
    compiled = torch.compile(lambda a, b: wrap_nki(_grid_scale_add)[2](a, b, 3.0) - b, backend="neuron", fullgraph=True)
    _close(compiled(a.to(DEV), b.to(DEV)), a * 3.0)


def test_output_argument_kernel_is_functionalized():
    x = torch.randn(130, 8)
    scale = wrap_nki(_scale_into)
    out = torch.zeros(130, 8, device=DEV)
    assert scale(x.to(DEV), out, factor=3.0) is None
    _close(out, x * 3)

    def f(x):
        buf = torch.zeros_like(x)
        scale(x, buf)
        return buf + 1

    _close(torch.compile(f, backend="neuron", fullgraph=True)(x.to(DEV)), x * 2 + 1)


# --------------------------------------------------------------------------- #
# nki_op
# --------------------------------------------------------------------------- #


@nki_op("nki_test::rmsnorm", mutates_args=())
def rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    return wrap_nki(nki_rmsnorm)(x.reshape(-1, shape[-1]), weight, eps).reshape(shape)


@nki_op("nki_test::scale_", mutates_args={"x"})
def scale_inplace(x: torch.Tensor, factor: float) -> None:
    x.copy_(wrap_nki(_grid_scale_add)[(x.shape[0] + 127) // 128](x, torch.zeros_like(x), factor))


@nki_op("nki_test::softmax", mutates_args=())
@nki.jit
def softmax_op(x: torch.Tensor) -> torch.Tensor:
    return nki_softmax.fn(x)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward_fn(ctx, grad):
    (y,) = ctx.saved_tensors
    return wrap_nki(_softmax_backward)(y, grad.contiguous())


softmax_op.register_autograd(_softmax_backward_fn, setup_context=_softmax_setup)


def test_nki_op_registers_a_torch_custom_op():
    x, w = torch.randn(2, 5, 48, device=DEV), torch.randn(48, device=DEV)
    assert torch.ops.nki_test.rmsnorm.default._schema.arguments[2].type.kind() == "FloatType"
    _close(rmsnorm_op(x, w, 1e-6), rmsnorm_ref(x.cpu(), w.cpu()))
    result = torch.library.opcheck(rmsnorm_op, (x, w, 1e-6), test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}


def test_nki_op_compiles_without_graph_break():
    x, w = torch.randn(3, 130, 32), torch.randn(32)

    def f(x, w):
        h = torch.ops.nki_test.rmsnorm(x + 1, w, 1e-6)
        return h @ h.transpose(-1, -2)

    explanation = torch._dynamo.explain(f)(x.to(DEV), w.to(DEV))
    assert explanation.graph_break_count == 0
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    ref = rmsnorm_ref(x + 1, w)
    _close(compiled(x.to(DEV), w.to(DEV)), ref @ ref.transpose(-1, -2), tol=1e-4)


def test_nki_op_mutates_args_eager_and_compiled():
    x = torch.randn(200, 24)
    y = x.to(DEV)
    scale_inplace(y, 0.25)
    _close(y, x * 0.25)

    def f(x):
        z = x.clone()
        scale_inplace(z, 4.0)
        return z - x

    _close(torch.compile(f, backend="neuron", fullgraph=True)(x.to(DEV)), x * 3.0)


def test_nki_op_autograd_backward_is_a_kernel():
    x = torch.randn(130, 40)
    upstream = torch.randn(130, 40)
    xn = x.to(DEV).requires_grad_()
    out = softmax_op(xn)
    out.backward(upstream.to(DEV))
    xr = x.clone().requires_grad_()
    torch.softmax(xr, -1).backward(upstream)
    _close(out, torch.softmax(x, -1))
    _close(xn.grad, xr.grad)
    # Same gradient through a compiled training step.
    xc = x.to(DEV).requires_grad_()
    loss = torch.compile(lambda t: (softmax_op(t * 2) * upstream.to(DEV)).sum(), backend="neuron", fullgraph=True)(xc)
    loss.backward()
    xr.grad = None
    (torch.softmax(xr * 2, -1) * upstream).sum().backward()
    _close(xc.grad, xr.grad)


def test_nki_op_gradcheck():
    # Gradients of a kernel-backed op against finite differences. NKI has no float64,
    # so float32 with a large step (the op is linear: differences are exact up to rounding).
    @nki_op("nki_test::scale_add", mutates_args=())
    def scale_add(a: torch.Tensor, b: torch.Tensor, s: float) -> torch.Tensor:
        return wrap_nki(_grid_scale_add)[1](a, b, s)

    scale_add.register_autograd(
        lambda ctx, g: (wrap_nki(_grid_scale_add)[1](g, torch.zeros_like(g), ctx.s), g, None),
        setup_context=lambda ctx, inputs, output: setattr(ctx, "s", inputs[2]),
    )
    a = torch.randn(5, 6, device=DEV, requires_grad=True)
    b = torch.randn(5, 6, device=DEV, requires_grad=True)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(lambda a, b: scale_add(a, b, 1.5), (a, b), eps=1e-2, atol=1e-3, rtol=1e-3)


def test_nki_op_requires_annotations():
    @nki.jit
    def unannotated(x):
        return x

    with pytest.raises(ValueError, match="infer_schema"):
        nki_op("nki_test::unannotated", unannotated, mutates_args=())


def test_exports():
    assert torch_neuronx.nki_op is nki.nki_op is nki_op
    assert torch_neuronx.wrap_nki is nki.wrap_nki is wrap_nki
