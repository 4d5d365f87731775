"""The kernels as torch custom ops (``torch_neuronx.nki_op``), with gradients.

Registering them as custom ops is what lets a kernelized model run under
``torch.compile(backend="neuron", fullgraph=True)``: each op is one graph node
whose output shapes come from tracing the kernel. Backwards are plain torch ops
(exact formulas), so kernelized layers also train.
"""
import torch
from torch_neuronx import nki_op, wrap_nki

from ._kernels import mlp_kernel, rms_norm_kernel

_NS = "nki_transformer_kernels"


@nki_op(f"{_NS}::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return wrap_nki(rms_norm_kernel)(rows, weight, eps).reshape(x.shape)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    xf, gf, wf = x.float(), grad.float(), weight.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = gf * wf
    grad_x = rstd * (gw - xf * rstd.pow(2) * (gw * xf).mean(-1, keepdim=True))
    grad_w = (gf * xf * rstd).reshape(-1, x.shape[-1]).sum(0)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@nki_op(f"{_NS}::mlp", mutates_args=())
def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """``fc2(gelu(fc1(x)))`` (exact erf GELU) over the last dimension of ``x``, one NKI kernel."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return wrap_nki(mlp_kernel)(rows, w1, b1, w2, b2).reshape(x.shape)


def _mlp_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mlp_backward(ctx, grad):
    x, w1, b1, w2, b2 = ctx.saved_tensors
    rows = x.reshape(-1, x.shape[-1])
    g = grad.reshape(-1, grad.shape[-1])
    pre = torch.nn.functional.linear(rows, w1, b1)  # recomputed, as the kernel keeps no activations
    hidden = torch.nn.functional.gelu(pre)
    grad_hidden = g @ w2
    grad_pre = torch.ops.aten.gelu_backward(grad_hidden, pre)
    return ((grad_pre @ w1).reshape(x.shape), grad_pre.t() @ rows, grad_pre.sum(0),
            g.t() @ hidden, g.sum(0))


mlp.register_autograd(_mlp_backward, setup_context=_mlp_setup)
