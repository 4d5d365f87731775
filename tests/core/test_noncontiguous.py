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
from torch.testing._internal.common_utils import noncontiguous_like

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


MATMUL = next(op for op in op_db if op.name == "matmul")


def _matmul_grads(a, b, cot):
    out = torch.matmul(a, b)
    return (out.detach(), *torch.autograd.grad(out, (a, b), cot))


@pytest.mark.parametrize("noncontiguous", [False, True], ids=["contiguous", "noncontiguous"])
def test_matmul_grads_equal_cpu_bit_for_bit_on_neurons_numbers(noncontiguous):
    """Every matmul sample, with the numbers neuron's own generator draws (the numbers PyTorch's
    ``test_noncontiguous_samples`` gets on neuron), gives CPU's output and gradients bit for bit:
    neuron's matmul and its backward take CPU's path (the same folding into mv/mm, the same
    kernels) for contiguous and noncontiguous layouts alike. (Upstream's test compares the
    contiguous and noncontiguous gradients of one device with each other; for some numbers
    they differ by more than its tolerance on CPU as on neuron, since the two layouts reach
    BLAS with different reduction orders.)"""
    with torch_neuronx.cpu_equal_rng(False):  # neuron's (seed, offset) stream, as upstream's run draws
        torch.manual_seed(1234)
        samples = list(MATMUL.sample_inputs("neuron", torch.float32, requires_grad=True))
        cots = [torch.randn(torch.matmul(s.input, s.args[0]).shape, device="neuron") for s in samples]
    assert len(samples) > 12  # the batched 4-d @ 1-d sample upstream reported is among them
    for i, (sample, cot) in enumerate(zip(samples, cots)):
        a, b = sample.input, sample.args[0]
        cpu = [t.detach().cpu().requires_grad_() for t in (a, b)] + [cot.cpu()]
        dev = [t.detach().clone().requires_grad_() for t in (a, b)] + [cot]
        if noncontiguous:
            cpu = [noncontiguous_like(t.detach()).requires_grad_(t.requires_grad) for t in cpu]
            dev = [noncontiguous_like(t.detach()).requires_grad_(t.requires_grad) for t in dev]
            assert not dev[0].is_contiguous() or dev[0].numel() <= 1
        for got, expected in zip(_matmul_grads(*dev), _matmul_grads(*cpu)):
            assert got.device.type == "neuron"
            assert torch.equal(got.cpu(), expected), f"sample {i}: {tuple(a.shape)} @ {tuple(b.shape)}"
