"""Noncontiguous samples of every OpInfo on neuron equal CPU's.

For each OpInfo of ``op_db`` that runs at float32 on CPU, the first samples are
made noncontiguous (``SampleInput.noncontiguous()``, as PyTorch's
``test_noncontiguous_samples`` does) and run on CPU and on neuron with the same
seed; outputs and input gradients must agree. Samples CPU itself rejects, and
ops whose result is not a function of their inputs, are left out.
"""
import pytest
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db

MAX_SAMPLES = 3
SKIP = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
        "to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce"}  # sparse: refused by design on neuron
OPS = [op for op in op_db if op.name not in SKIP and torch.float32 in op.supported_dtypes("cpu")]


def _to(obj, device):
    def move(t):
        r = t.detach().to(device)
        r.requires_grad_(t.requires_grad)
        return r

    return pytree.tree_map_only(torch.Tensor, move, obj)


def _run(op, parts, seed):
    inp, args, kwargs = parts
    torch.manual_seed(seed)
    out = op(inp, *args, **kwargs)
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    leaves = [t for t in pytree.tree_leaves(parts) if isinstance(t, torch.Tensor) and t.requires_grad]
    diff = [t for t in outs if t.requires_grad and t.is_floating_point()]
    grads = []
    if leaves and diff:
        torch.manual_seed(seed + 1)
        cot = [torch.randn(t.shape).to(t.device, t.dtype) for t in diff]
        grads = torch.autograd.grad(diff, leaves, cot, allow_unused=True)
    return [t.detach() for t in outs], list(grads)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name)
def test_noncontiguous_matches_cpu(op):
    grad = op.supports_autograd
    ran = 0
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=grad)):
        if ran == MAX_SAMPLES:
            break
        sample = sample.noncontiguous()
        parts = (sample.input, sample.args, sample.kwargs)
        try:
            expected = _run(op, parts, 1234 + i)
            again = _run(op, _to(parts, "cpu"), 1234 + i)
        except Exception:
            continue  # CPU rejects this sample
        if not all(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))
                   for a, b in zip(expected[0], again[0]) if a.layout == torch.strided):
            continue  # nondeterministic on CPU
        got = _run(op, _to(parts, "neuron"), 1234 + i)
        ran += 1
        for g, e in zip(got, expected):
            assert len(g) == len(e)
            for a, b in zip(g, e):
                if b is None:
                    assert a is None
                    continue
                assert a.device.type == "neuron"
                torch.testing.assert_close(a.cpu(), b, equal_nan=True)
    if ran == 0:
        pytest.skip("no float32 sample runs on CPU")
