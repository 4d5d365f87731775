"""Fast op parity smoke test: a few hand-picked ops, forward and backward, on
``neuron`` against CPU.  The simulator runs CPU's kernels, so results must be
bitwise equal (random ops use the same seed on both devices and, inside
torch_neuronx.cpu_equal_rng(), CPU's stream on neuron).

The full OpInfo-driven suite is tests/core/test_op_parity.py (marked slow).
"""

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import torch_neuronx

DEVICE = "neuron"
SEED = 1234


def _t(*shape, dtype=torch.float32, grad=True, low=None, high=None):
    """Spec of an input tensor; materialized per case with a seeded generator."""
    return ("tensor", shape, dtype, grad, low, high)


def _materialize(specs, gen):
    out = []
    for s in specs:
        if isinstance(s, tuple) and s and s[0] == "tensor":
            _, shape, dtype, grad, low, high = s
            if dtype.is_floating_point:
                t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
            elif dtype == torch.bool:
                t = torch.rand(shape, generator=gen) > 0.5
            else:
                t = torch.randint(low or 0, high or 10, shape, generator=gen, dtype=dtype)
            out.append(t.requires_grad_(grad and dtype.is_floating_point))
        else:
            out.append(s)
    return out


def _index_put(x, v):
    idx = torch.tensor([0, 2, 0, 3], device=x.device)
    return x.clone().index_put_((idx,), v, accumulate=True)


def _scatter_add(x, src):
    index = torch.tensor([[0, 1, 2, 0], [1, 2, 0, 0], [4, 3, 2, 1]], device=x.device)
    return x.scatter_add(0, index, src)


def _embedding(w):
    ids = torch.tensor([[1, 3, 3, 0], [9, 2, 1, 1]], device=w.device)
    return F.embedding(ids, w, padding_idx=1)


def _masked_fill(x, m):
    return x.masked_fill(m, -1.5)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _native_dropout(x):
    return torch.ops.aten.native_dropout(x, 0.3, True)


def _dropout(x):
    return F.dropout(x, p=0.4, training=True)


CASES = {
    "add": (torch.add, [_t(4, 5), _t(1, 5)]),
    "add_int64": (torch.add, [_t(4, 5, dtype=torch.int64), _t(5, dtype=torch.int64)]),
    "matmul": (torch.matmul, [_t(3, 4, 6), _t(6, 5)]),
    "matmul_bf16": (torch.matmul, [_t(8, 16, dtype=torch.bfloat16), _t(16, 4, dtype=torch.bfloat16)]),
    "softmax": (lambda x: torch.softmax(x, dim=-1), [_t(4, 7)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5), [_t(2, 3, 6), _t(6), _t(6)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), [_t(2, 3, 7, 7), _t(4, 3, 3, 3), _t(4)]),
    "index_put_": (_index_put, [_t(5, 3), _t(4, 3)]),
    "scatter_add": (_scatter_add, [_t(5, 4), _t(3, 4)]),
    "cumsum": (lambda x: torch.cumsum(x, dim=1), [_t(3, 9)]),
    "topk": (lambda x: torch.topk(x, 3, dim=-1), [_t(4, 10)]),
    "sort": (lambda x: torch.sort(x, dim=0, descending=True, stable=True), [_t(6, 5)]),
    "embedding": (_embedding, [_t(10, 4)]),
    "sdpa": (_sdpa, [_t(2, 2, 5, 8), _t(2, 2, 5, 8), _t(2, 2, 5, 8)]),
    "where": (torch.where, [_t(4, 5, dtype=torch.bool), _t(4, 5), _t(4, 1)]),
    "masked_fill": (_masked_fill, [_t(4, 5), _t(4, 5, dtype=torch.bool)]),
    "native_dropout": (_native_dropout, [_t(16, 32)]),
    "dropout": (_dropout, [_t(16, 32)]),
}


RANDOM = {"native_dropout", "dropout"}


def _run(fn, inputs, device):
    args = [
        (a.detach().to(device).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a) for a in inputs
    ]
    torch.manual_seed(SEED)  # seeds CPU and neuron generators
    out = fn(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = ()
    if leaves and outs:
        g = torch.Generator().manual_seed(SEED + 1)
        cots = [torch.randn(o.shape, generator=g).to(o.dtype).to(device) for o in outs]
        loss = sum((o * c).sum() for o, c in zip(outs, cots))
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return out, grads


def _cpu(x):
    return pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


@pytest.mark.parametrize("name", list(CASES))
def test_smoke_parity(name):
    fn, specs = CASES[name]
    inputs = _materialize(specs, torch.Generator().manual_seed(SEED))
    # Neuron's own generator draws other numbers than CPU's; compare the random ops on CPU's stream.
    with torch_neuronx.cpu_equal_rng(name in RANDOM):
        ref_out, ref_grads = _run(fn, inputs, "cpu")
        out, grads = _run(fn, inputs, DEVICE)
    for o in pytree.tree_leaves(out):
        if isinstance(o, torch.Tensor):
            assert o.device.type == DEVICE, f"{name}: output on {o.device}"
    torch.testing.assert_close(_cpu(out), ref_out, rtol=0, atol=0, equal_nan=True)
    assert (len(grads) > 0) == any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)
    torch.testing.assert_close(_cpu(grads), _cpu(ref_grads), rtol=0, atol=0, equal_nan=True)
