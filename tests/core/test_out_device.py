"""``out=`` on another device raises, as on CUDA, for every OpInfo with an out variant.

For each OpInfo of PyTorch's ``op_db`` that supports ``out=``, the first float32
sample runs on neuron; then the op is called again with ``out=`` tensors of the
right shape on CPU, and on ``neuron:1`` next to ``neuron:0`` inputs. Both must
raise ``RuntimeError`` before writing: the sentinel-filled out tensors stay
untouched. On the right device, contiguous, noncontiguous and empty (resized)
``out=`` tensors must receive CPU's values.
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


SENTINEL = 7.0
# Ops whose out= decides the device on every device type (CUDA included).
OUT_DECIDES_DEVICE = {
    "lu": "torch.lu copies its results into out= in Python",
    "linspace": "reads its 0-dim tensor bounds as numbers",
    "logspace": "reads its 0-dim tensor bounds as numbers",
}
OUT_OPS = [op for op in op_db if op.supports_out and torch.float32 in op.supported_dtypes("cpu")]


def _first_sample(op):
    for s in op.sample_inputs("cpu", torch.float32):
        try:
            neuron = s.transform(lambda t: t.to("neuron") if isinstance(t, torch.Tensor) else t)
        except NotImplementedError:
            continue  # a sparse sample: sparse layouts are refused on neuron by design
        try:
            torch.manual_seed(0)
            expected = op(s.input, *s.args, **s.kwargs)
            result = op(neuron.input, *neuron.args, **neuron.kwargs)
        except Exception:
            continue  # a sample the op rejects (also on CPU); try the next one
        return s, neuron, expected, result
    return None, None, None, None


def _noncontiguous(t):
    return torch.zeros(*t.shape, 2, dtype=t.dtype, device=t.device)[..., 0] if t.dim() else torch.zeros_like(t)


def _names_device(sample):
    """The sample places its result itself (device="cpu", .to("cpu"), ...)."""
    leaves = pytree.tree_leaves((sample.args, sample.kwargs))
    return any(isinstance(v, torch.device) or (isinstance(v, str) and v.startswith("cpu")) for v in leaves)


def _outs_like(result, device):
    def make(t):
        return (
            torch.full_like(t, SENTINEL, device=device) if t.is_floating_point() else torch.zeros_like(t, device=device)
        )

    return pytree.tree_map_only(torch.Tensor, make, result)


def test_acos_out_on_cpu_raises_like_cuda():
    x = torch.rand(4, device="neuron")
    y = torch.full((4,), SENTINEL)
    with pytest.raises(RuntimeError, match=r"Expected out tensor to have device neuron:0, but got cpu instead"):
        torch.acos(x, out=y)
    assert torch.equal(y, torch.full((4,), SENTINEL))
    z = torch.full((4,), SENTINEL, device="neuron:1")
    with pytest.raises(RuntimeError, match=r"Expected out tensor to have device neuron:0, but got neuron:1 instead"):
        torch.acos(x, out=z)
    assert torch.equal(z.cpu(), torch.full((4,), SENTINEL))


@pytest.mark.slow
@pytest.mark.parametrize("op", OUT_OPS, ids=lambda op: op.full_name if hasattr(op, "full_name") else op.name)
def test_out_on_another_device_raises(op):
    cpu_sample, sample, expected, result = _first_sample(op)
    if sample is None or not pytree.tree_leaves(result):
        pytest.skip("no float32 sample runs")
    if not all(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(result)):
        pytest.skip("result is not a tensor structure")
    has_neuron_input = not _names_device(sample) and any(
        isinstance(t, torch.Tensor) for t in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    )
    # Factories (arange, linspace, ...) have no input device: out= decides it, as on CUDA.
    wrong_devices = ("cpu", "neuron:1") if has_neuron_input and op.name not in OUT_DECIDES_DEVICE else ()
    try:
        op(cpu_sample.input, *cpu_sample.args, out=_outs_like(expected, "cpu"), **cpu_sample.kwargs)
    except Exception:
        wrong_devices = ()  # CPU rejects out= of this structure (e.g. histogramdd's edges list)
    for device in wrong_devices:
        out = _outs_like(result, device)
        before = [t.cpu().clone() for t in pytree.tree_leaves(out)]
        with pytest.raises(RuntimeError):
            op(sample.input, *sample.args, out=out, **sample.kwargs)
        after = [t.cpu() for t in pytree.tree_leaves(out)]
        assert all(torch.equal(a, b) for a, b in zip(before, after)), f"{op.name} wrote into out= on {device}"

    if not has_neuron_input:
        return  # a factory sample names its device (cpu) itself
    # On the right device: CPU's values, whatever the out tensors' layout.
    for make in (torch.zeros_like, _noncontiguous, lambda t: t.new_empty(0)):
        cpu_out = pytree.tree_map_only(torch.Tensor, make, expected)
        neuron_out = pytree.tree_map_only(torch.Tensor, lambda t, make=make: make(t.to("neuron")), expected)
        try:
            torch.manual_seed(0)
            op(cpu_sample.input, *cpu_sample.args, out=cpu_out, **cpu_sample.kwargs)
        except Exception:
            continue  # CPU rejects this out= layout too
        torch.manual_seed(0)
        op(sample.input, *sample.args, out=neuron_out, **sample.kwargs)
        for a, b in zip(pytree.tree_leaves(neuron_out), pytree.tree_leaves(cpu_out)):
            assert a.device.type == "neuron" and a.shape == b.shape
            torch.testing.assert_close(a.cpu(), b, equal_nan=True)


def test_mode_on_neuron_matches_cpu():
    x = torch.tensor([[1.0, 2, 2, 5], [3, 3, 1, 1], [4, 0, 0, 4]])
    values, indices = torch.empty(3, device="neuron"), torch.empty(3, dtype=torch.long, device="neuron")
    got = torch.mode(x.to("neuron"), 1, out=(values, indices))
    expected = torch.mode(x, 1)
    assert got.values is values and got.indices is indices
    assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)
    functional = torch.mode(x.to("neuron"), 0, keepdim=True)
    assert torch.equal(functional.values.cpu(), torch.mode(x, 0, keepdim=True).values)


def test_zero_dim_cpu_out_is_not_a_scalar_operand():
    # A 0-dim CPU tensor may be read as a scalar operand, but never written.
    a = torch.tensor(2.0, device="neuron")
    out = torch.tensor(SENTINEL)
    with pytest.raises(RuntimeError, match="Expected out tensor to have device neuron:0, but got cpu instead"):
        torch.add(a, a, out=out)
    assert out.item() == SENTINEL
    assert torch.add(a, torch.tensor(3.0)).item() == 5.0
