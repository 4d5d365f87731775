"""Noncontiguous samples of every OpInfo on neuron equal CPU's.

For each OpInfo of ``op_db`` that runs at float32 on CPU, the first samples are
made noncontiguous (``SampleInput.noncontiguous()``, as PyTorch's
``test_noncontiguous_samples`` does, on each device so that both get the same
layout) and run on CPU and on neuron with the same seed; outputs and input gradients must agree. Samples CPU itself rejects, and
ops whose result is not a function of their inputs, are left out.
"""

import pytest
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db

import torch_neuronx


@pytest.fixture(autouse=True)
def _cpu_equal_rng():
    # Random ops are compared with CPU's on the same seed: neuron's own generator
    # (seed, offset, as AWS documents it) draws other numbers than CPU's.
    with torch_neuronx.cpu_equal_rng():
        yield


MAX_SAMPLES = 3
SKIP = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
    "to_sparse",
    "sparse.sampled_addmm",
    "sparse.mm",
}  # sparse: refused by design on neuron
# Ops whose sample keeps a tensor on CPU by design, on every device.
CPU_ARGS = {"tensor_split": "its indices tensor must be on CPU"}
OPS = [op for op in op_db if op.name not in SKIP and torch.float32 in op.supported_dtypes("cpu")]


def _to(obj, device):
    moved = {}  # one copy per tensor: a sample may pass the same tensor twice

    def move(t):
        if id(t) not in moved:
            moved[id(t)] = t.detach().to(device).requires_grad_(t.requires_grad)
        return moved[id(t)]

    return pytree.tree_map_only(torch.Tensor, move, obj)


def _names_device(sample):
    """The sample places its result itself (device="cpu", .to("cpu"), ...)."""
    leaves = pytree.tree_leaves((sample.args, sample.kwargs))
    return any(isinstance(v, torch.device) or (isinstance(v, str) and v.startswith("cpu")) for v in leaves)


def _same(a, b):
    if a.layout != torch.strided:
        return True
    if a.dtype == torch.complex32:
        a, b = a.to(torch.complex64), b.to(torch.complex64)
    return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))


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
@pytest.mark.parametrize(
    "op", OPS, ids=lambda op: f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
)
def test_noncontiguous_matches_cpu(op):
    grad = op.supports_autograd
    ran = 0
    if op.name in CPU_ARGS:
        pytest.skip(CPU_ARGS[op.name])
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=grad)):
        if ran == MAX_SAMPLES:
            break
        if not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))):
            continue  # a factory: no input to make noncontiguous
        if _names_device(sample):
            continue
        # The same noncontiguous layout on both devices (moving a view would compact it).
        neuron_sample = sample.transform(lambda t: _to(t, "neuron") if isinstance(t, torch.Tensor) else t)
        sample, neuron_sample = sample.noncontiguous(), neuron_sample.noncontiguous()
        parts = (sample.input, sample.args, sample.kwargs)
        try:
            expected = _run(op, parts, 1234 + i)
            again = _run(op, _to(parts, "cpu"), 1234 + i)
        except Exception:
            continue  # CPU rejects this sample
        if not all(_same(a, b) for a, b in zip(expected[0], again[0])):
            continue  # nondeterministic on CPU
        got = _run(op, (neuron_sample.input, neuron_sample.args, neuron_sample.kwargs), 1234 + i)
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
