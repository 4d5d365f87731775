"""Tensor kinds beyond dense strided ones on neuron: nested tensors run and
equal CPU under the argument rules and op tracking of dense ops, quantized and
sparse COO ones are refused where they would be made, and value checks CPU
makes (one_hot) raise CPU's errors."""

import re
import warnings

import pytest
import torch
from torch import nn

import torch_neuronx

DEVICE = "neuron"
warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")


# --- nested tensors ---------------------------------------------------------


def _nested(device):
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 6, generator=g), torch.randn(4, 6, generator=g)]
    return torch.nested.nested_tensor([p.to(device) for p in parts])


@pytest.mark.parametrize(
    "name,fn",
    [
        ("add", lambda nt: nt + 1),
        ("mul_nested", lambda nt: nt * nt),
        ("relu", lambda nt: torch.relu(nt)),
        ("softmax", lambda nt: torch.softmax(nt, -1)),
        ("transpose_matmul", lambda nt: torch.matmul(nt, nt.transpose(1, 2))),
        ("linear", lambda nt: nn.functional.linear(nt, torch.ones(3, 6, device=nt.device))),
        ("to_padded", lambda nt: nt.to_padded_tensor(0.0)),
        ("unbind", lambda nt: nt.unbind()),
        ("inplace_mul", lambda nt: nt.mul_(2.0)),
    ],
)
def test_nested_ops_equal_cpu(name, fn):
    ref = fn(_nested("cpu"))
    out = fn(_nested(DEVICE))
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = out if isinstance(out, tuple) else (out,)
    for r, o in zip(refs, outs):
        assert o.device.type == DEVICE
        assert o.is_nested == r.is_nested
        if r.is_nested:
            r, o = r.to_padded_tensor(0.0), o.to_padded_tensor(0.0)
        torch.testing.assert_close(o.cpu(), r, rtol=0, atol=0)


def test_nested_inplace_returns_self():
    nt = _nested(DEVICE)
    assert nt.mul_(2.0) is nt


# One rule, one wording, for dense and nested ops: a CPU tensor next to neuron ones.
_MISMATCH = (
    "Expected all tensors to be on the same device, but got {arg} is on cpu, different from other tensors "
    "on neuron:0 (when checking argument in method {op})"
)


@pytest.mark.parametrize(
    "arg,op,fn",
    [
        ("mat2", "aten::mm", lambda: torch.mm(torch.ones(2, 6, device=DEVICE), torch.ones(6, 3))),
        ("mat", "aten::addmv", lambda: torch.addmv(torch.ones(2, device=DEVICE), torch.ones(2, 3), torch.ones(3))),
        ("weight", "aten::linear", lambda: nn.functional.linear(_nested(DEVICE), torch.ones(3, 6))),
        ("other", "aten::mul.Tensor", lambda: _nested(DEVICE) * _nested("cpu")),
    ],
    ids=["dense_fast_path", "dense_fallback", "nested_linear", "nested_mul"],
)
def test_cpu_tensor_next_to_neuron_raises_one_wording(arg, op, fn):
    with pytest.raises(RuntimeError, match=re.escape(_MISMATCH.format(arg=arg, op=op))):
        fn()


def test_nested_op_takes_a_cpu_scalar_as_dense_ops_do():
    scalar = torch.tensor(2.0)  # 0-dim CPU tensors are scalar operands (as on CUDA)
    out = _nested(DEVICE) * scalar
    assert out.device.type == DEVICE
    torch.testing.assert_close(out.to_padded_tensor(0.0).cpu(), (_nested("cpu") * scalar).to_padded_tensor(0.0))


def test_nested_copy_from_cpu_takes_the_cpu_tensor():
    # A copy between devices is the one op whose CPU argument is no mistake.
    cpu = _nested("cpu")
    out = cpu.to(DEVICE)
    assert out.device.type == DEVICE and out.is_nested
    torch.testing.assert_close(out.to_padded_tensor(0.0).cpu(), cpu.to_padded_tensor(0.0), rtol=0, atol=0)


def _assert_nested_equal(out, ref, device):
    assert out.is_nested and out.device.type == device
    assert len(out.unbind()) == len(ref.unbind())
    for o, r in zip(out.unbind(), ref.unbind()):
        assert o.device.type == device
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_nested_round_trip_to_neuron_and_back_to_cpu():
    cpu = _nested("cpu")
    dev = cpu.to(DEVICE)
    _assert_nested_equal(dev.cpu(), cpu, "cpu")
    _assert_nested_equal(dev.to("cpu"), cpu, "cpu")
    back = dev.to("cpu", torch.float64)
    assert back.dtype == torch.float64
    _assert_nested_equal(back, cpu.to(torch.float64), "cpu")
    # The copy owns host memory: writing it leaves the device tensor alone.
    back = dev.cpu()
    back.mul_(0)
    _assert_nested_equal(dev.cpu(), cpu, "cpu")


def test_nested_copy_into_a_cpu_tensor_stays_on_cpu():
    cpu = _nested("cpu")
    dst = torch.zeros_like(cpu)
    out = dst.copy_(cpu.to(DEVICE))
    assert out is dst
    _assert_nested_equal(dst, cpu, "cpu")


def _seed_offset():
    state = torch.neuron.get_rng_state()
    return state[:8].view(torch.int64).item(), state[8:].view(torch.int64).item()


@pytest.mark.parametrize(
    "name,fn,dense",
    [
        ("dropout", lambda x: nn.functional.dropout(x, 0.5), lambda b: nn.functional.dropout(b, 0.5)),
        ("randn_like", torch.randn_like, lambda b: torch.empty_like(b).normal_()),
        ("normal_", lambda x: x.normal_(1.0, 2.0), lambda b: b.normal_(1.0, 2.0)),
    ],
)
def test_nested_random_ops_draw_from_the_neuron_generator(name, fn, dense):
    # As CUDA's nested kernels, the dense op runs on the nested tensor's buffer:
    # it draws from the device's generator, whose offset advances.
    def run(f, x):
        torch.manual_seed(7)
        cpu_before = torch.get_rng_state()
        out = f(x)
        assert torch.equal(torch.get_rng_state(), cpu_before), "drew from CPU's generator"
        return out, _seed_offset()

    nested = _nested(DEVICE)
    buffer = torch.cat([t.reshape(-1) for t in nested.unbind()])
    out, (seed, offset) = run(fn, nested.clone())
    again, _ = run(fn, nested.clone())
    ref, ref_state = run(dense, buffer.clone())
    assert (seed, offset) == ref_state and seed == 7 and offset >= buffer.numel()
    assert out.is_nested and out.device.type == DEVICE
    flat = torch.cat([t.reshape(-1) for t in out.unbind()]).cpu()
    torch.testing.assert_close(flat, torch.cat([t.reshape(-1) for t in again.unbind()]).cpu(), rtol=0, atol=0)
    torch.testing.assert_close(flat, ref.cpu(), rtol=0, atol=0)


def test_nested_ops_are_counted_and_recorded_as_dense_ones():
    nt = torch.nested.nested_tensor([torch.ones(2, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)])
    nt = nt.to(DEVICE)
    dense = torch.ones(2, dtype=torch.float64, device=DEVICE)
    for x in (nt, dense):
        torch_neuronx.clear_op_tracking()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.relu(x)
        assert torch_neuronx.get_executed_ops() == {"aten::relu": 1}
        assert torch_neuronx.get_fallback_ops() == {"aten::relu": ["float64 is not native on Trainium"]}
    torch_neuronx.clear_op_tracking()


def _padded_batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randn(3, 5, 16, generator=g)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 2 + [True] * 3])
    return src, mask


def test_transformer_encoder_fast_path_equals_cpu():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()
    src, mask = _padded_batch()
    with torch.inference_mode():
        ref = enc(src, src_key_padding_mask=mask)
        enc.to(DEVICE)
        out = enc(src.to(DEVICE), src_key_padding_mask=mask.to(DEVICE))
    assert out.device.type == DEVICE
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_multihead_attention_eval_with_padding_mask_equals_cpu():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    src, mask = _padded_batch()
    with torch.inference_mode():
        ref, ref_w = mha(src, src, src, key_padding_mask=mask)
        mha.to(DEVICE)
        d = src.to(DEVICE)
        out, w = mha(d, d, d, key_padding_mask=mask.to(DEVICE))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.cpu(), ref_w, rtol=1e-5, atol=1e-5)


# --- quantized tensors: refused at creation ----------------------------------

QUANT = "does not support quantized tensors"


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.quantize_per_tensor(torch.randn(4, 4, device=DEVICE), 0.1, 0, torch.qint8),
        lambda: torch.quantize_per_tensor(torch.randn(4, device=DEVICE), 0.1, 3, torch.quint8),
        lambda: torch._empty_affine_quantized((2, 2), scale=0.1, zero_point=0, dtype=torch.quint8, device=DEVICE),
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8).to(DEVICE),
        lambda: torch.quantize_per_channel(
            torch.randn(4, 4, device=DEVICE),
            torch.ones(4, device=DEVICE),
            torch.zeros(4, dtype=torch.long, device=DEVICE),
            0,
            torch.qint8,
        ),
    ],
    ids=["per_tensor_qint8", "per_tensor_quint8", "empty_affine", "cpu_to_neuron", "per_channel"],
)
def test_quantized_refused_at_creation(make):
    with pytest.raises(NotImplementedError, match=QUANT):
        make()


# --- sparse layouts: refused at the boundary -----------------------------------


def test_sparse_coo_refused_on_to_and_factory():
    with pytest.raises(NotImplementedError, match="Trainium has no sparse kernels"):
        torch.eye(4).to_sparse().to(DEVICE)
    with pytest.raises(NotImplementedError, match="Trainium has no sparse kernels"):
        torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), device=DEVICE)
    with pytest.raises(NotImplementedError, match="Trainium has no sparse kernels"):
        torch.empty(2, 2, layout=torch.sparse_csr, device=DEVICE)


_CROW, _COL, _VAL = torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.ones(2)


@pytest.mark.parametrize(
    "make,layout",
    [
        (lambda: torch.eye(4).to_sparse_csr().to(DEVICE), "SparseCsr"),
        (lambda: torch.eye(4).to_sparse_csc().to(DEVICE), "SparseCsc"),
        (lambda: torch.eye(4).to_sparse_bsr((2, 2)).to(DEVICE), "SparseBsr"),
        (lambda: torch.eye(4).to_sparse_bsc((2, 2)).to(DEVICE), "SparseBsc"),
        (lambda: torch.eye(4).to_sparse_csr().to(DEVICE, torch.float64), "SparseCsr"),
        (lambda: torch.sparse_csr_tensor(_CROW, _COL, _VAL, (2, 2), device=DEVICE), "SparseCsr"),
        (lambda: torch.sparse_csc_tensor(_CROW, _COL, _VAL, device=DEVICE), "SparseCsc"),
        (lambda: torch.sparse_csr_tensor(_CROW.to(DEVICE), _COL.to(DEVICE), _VAL.to(DEVICE), (2, 2)), "sparse"),
        (lambda: torch.zeros(2, 2, layout=torch.sparse_csc, device=DEVICE), "SparseCsc"),
        (lambda: torch.eye(4, device=DEVICE).to_sparse(layout=torch.sparse_bsc, blocksize=(2, 2)), "SparseBsc"),
    ],
    ids=[
        "to_csr",
        "to_csc",
        "to_bsr",
        "to_bsc",
        "to_with_dtype",
        "csr_factory",
        "csc_factory_no_size",
        "neuron_components",
        "zeros_csc",
        "to_sparse_bsc",
    ],
)
def test_sparse_compressed_refused_at_creation(make, layout):
    # CSR/CSC/BSR/BSC never reach neuron: refused where they would be made, not on a later op
    with pytest.raises(NotImplementedError, match=f"(?i){layout}.*Trainium has no sparse kernels"):
        make()
    back = torch.eye(4).to_sparse_csr().to_dense().to(DEVICE)  # the documented round trip
    torch.testing.assert_close(back.cpu(), torch.eye(4), rtol=0, atol=0)


# --- one_hot: CPU's value checks -------------------------------------------


@pytest.mark.parametrize(
    "values,num_classes",
    [([0, 5], 3), ([-1, 0], 3), ([-1, 0], -1)],
    ids=["too_large", "negative", "negative_inferred"],
)
def test_one_hot_errors_equal_cpu(values, num_classes):
    with pytest.raises(RuntimeError) as cpu:
        nn.functional.one_hot(torch.tensor(values), num_classes)
    with pytest.raises(RuntimeError) as neuron:
        nn.functional.one_hot(torch.tensor(values, device=DEVICE), num_classes)
    assert str(neuron.value) == str(cpu.value)


def test_one_hot_equals_cpu():
    x = torch.tensor([[0, 2], [1, 1]])
    for n in (3, -1):
        out = nn.functional.one_hot(x.to(DEVICE), n)
        assert out.device.type == DEVICE
        assert torch.equal(out.cpu(), nn.functional.one_hot(x, n))
