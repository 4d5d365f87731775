"""Memory-overlap checks on neuron equal CPU's.

Every OpInfo with an in-place or out= variant is called with overlapping
arguments (a written-to tensor with internal overlap, or partially overlapping
its input) on CPU and on neuron: whatever CPU raises, neuron raises the same
error with the same message, and where CPU accepts the call neuron does too.
"""

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

DEVICE = "neuron"


def _outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        return None
    except Exception as e:  # the comparison is the point: CPU's error, or none
        return type(e).__name__, str(e).split("\n")[0].replace("neuron:0", "cpu").replace("neuron", "cpu")


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(e, device) for e in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _first_sample(op):
    for s in op.sample_inputs("cpu", torch.float32):
        if isinstance(s.input, torch.Tensor) and s.input.numel() > 1 and s.input.dim() > 0:
            return s
    return None


def _internal_overlap_self(sample, device):
    x = _to(sample.input, device)
    return x.reshape(-1)[:1].reshape([1] * x.dim()).expand(x.shape)


def _partial_overlap(sample, device):
    """self and the first same-shaped tensor argument over one buffer, shifted by one element."""
    x = sample.input
    pos = [i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor) and a.shape == x.shape]
    if not pos:
        return None
    base = torch.randn(x.numel() + 1, generator=torch.Generator().manual_seed(0)).to(device)
    args = list(_to(sample.args, device))
    args[pos[0]] = base[1:].view(x.shape)
    return base[:-1].view(x.shape), args


# Sparse ops have no neuron counterpart; CPU's batch-norm kernels with out=
# arguments are left out (their multiple outputs are not of this test's form).
_EXCLUDED = ("sparse.", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update")


def _cases():
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu") or op.full_name.startswith(_EXCLUDED):
            continue
        if op.inplace_variant is not None:
            yield pytest.param(op, "inplace_internal", id=f"{op.full_name}-inplace_internal")
            yield pytest.param(op, "inplace_partial", id=f"{op.full_name}-inplace_partial")
        if op.supports_out:
            yield pytest.param(op, "out_internal", id=f"{op.full_name}-out_internal")


def _run(op, kind, device):
    s = _first_sample(op)
    if s is None:
        return "skip"
    kwargs = _to(s.kwargs, device)
    if kind == "inplace_internal":
        self_ = _internal_overlap_self(s, device)
        return _outcome(lambda: op.inplace_variant(self_, *_to(s.args, device), **kwargs))
    if kind == "inplace_partial":
        case = _partial_overlap(s, device)
        if case is None:
            return "skip"
        self_, args = case
        return _outcome(lambda: op.inplace_variant(self_, *args, **kwargs))
    ref = op(s.input, *s.args, **s.kwargs)
    if not isinstance(ref, torch.Tensor) or ref.numel() < 2 or ref.dim() == 0:
        return "skip"
    # Every element of `out` is one memory location, but its storage holds
    # numel elements: a kernel that ignored the strides stays in bounds.
    out = torch.empty(ref.numel(), dtype=ref.dtype, device=device).as_strided(ref.shape, [0] * ref.dim())
    return _outcome(lambda: op(_to(s.input, device), *_to(s.args, device), out=out, **kwargs))


@pytest.mark.slow
@pytest.mark.parametrize("op,kind", list(_cases()))
def test_overlap_checks_match_cpu(op, kind):
    try:
        cpu = _run(op, kind, "cpu")
    except Exception as e:  # the sample itself does not run on CPU: nothing to compare
        pytest.skip(f"reference call fails on CPU: {type(e).__name__}")
    if cpu == "skip":
        pytest.skip("no sample of this form")
    assert _run(op, kind, DEVICE) == cpu


OVERLAP = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location"
INTERNAL = "unsupported operation: more than one element of the written-to tensor refers to a single memory location"


def _partial(device):
    base = torch.arange(11.0, device=device)
    return base[:10], base[1:11]


@pytest.mark.parametrize(
    "name,fn,message",
    [
        ("add_out", lambda a, b: torch.add(a, a, out=b), OVERLAP),
        ("mul_", lambda a, b: a.mul_(b), OVERLAP),
        ("index_put_", lambda a, b: a.index_put_((torch.tensor([0, 1], device=a.device),), b[:2]), None),
        ("index_copy_", lambda a, b: a.index_copy_(0, torch.tensor([0, 1], device=a.device), b[:2]), None),
        ("scatter_", lambda a, b: a.scatter_(0, torch.tensor([0, 1], device=a.device), b[:2]), None),
        ("masked_scatter_", lambda a, b: a.masked_scatter_(a > 3, b), None),
        ("copy_", lambda a, b: a.copy_(b), None),
        ("expanded_add_", lambda a, b: a[:1].expand(10).add_(1), INTERNAL),
    ],
)
def test_overlap_smoke(name, fn, message):
    a, b = _partial("cpu")
    cpu = _outcome(lambda: fn(a, b))
    if message is not None:
        assert cpu[0] == "RuntimeError" and cpu[1].startswith(message)
    a, b = _partial(DEVICE)
    assert _outcome(lambda: fn(a, b)) == cpu
