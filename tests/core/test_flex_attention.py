"""FlexAttention and varlen attention on neuron, against CPU references."""

import inspect
import sys
import warnings

import pytest
import torch
import torch._inductor.config
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
from torch.nn.attention.varlen import varlen_attn

from torch_neuronx import _compat

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

L, D = 64, 16
DOC_LENGTHS = (20, 30, 14)


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 16)


def _document_mask(device):
    doc = torch.repeat_interleave(torch.arange(len(DOC_LENGTHS)), torch.tensor(DOC_LENGTHS)).to(device)

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    return document


def alibi_like(score, b, h, q, kv):
    return score - (h + 1) * 0.05 * (q - kv).abs()


MASKS = {"causal": lambda device: causal, "sliding": lambda device: sliding_window, "document": _document_mask}


def _qkv(dtype, heads_q=4, heads_kv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads_q, L, D, generator=g)
    k, v = (torch.randn(2, heads_kv, L, D, generator=g) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


def _reference(q, k, v, mask_mod, score_mod=None):
    """float64 math on CPU with autograd: the score matrix spelled out."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ kk.transpose(-1, -2) / D**0.5
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in scores.shape), indexing="ij")
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    scores = scores.masked_fill(~mask_mod(b, h, i, j), float("-inf"))
    return torch.softmax(scores, -1) @ vv, (q, k, v)


def _run_neuron(q, k, v, mask_mod, score_mod=None, fn=flex_attention, **kwargs):
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    block_mask = create_block_mask(mask_mod, None, None, L, L, device="neuron")
    gqa = q.shape[1] != k.shape[1]
    out = fn(qn, kn, vn, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa, **kwargs)
    return out, (qn, kn, vn)


def _check_forward_backward(out, inputs, ref, ref_inputs, tol):
    torch.testing.assert_close(out.cpu().double(), ref, **tol)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad.to(out.dtype).to("neuron"))
    ref.backward(grad.double())
    for got, want in zip(inputs, ref_inputs):
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, **tol)


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_flex_masks_forward_backward_match_cpu_math(mask, dtype):
    q, k, v = _qkv(dtype)
    mask_mod = MASKS[mask]("neuron")
    out, inputs = _run_neuron(q, k, v, mask_mod)
    assert out.device.type == "neuron" and out.dtype == dtype
    ref, ref_inputs = _reference(q, k, v, MASKS[mask]("cpu"))
    _check_forward_backward(out, inputs, ref, ref_inputs, TOL[dtype])
    # CPU's own flex_attention (forward only on CPU) agrees too.
    cpu_out = flex_attention(q, k, v, block_mask=create_block_mask(MASKS[mask]("cpu"), None, None, L, L, device="cpu"))
    torch.testing.assert_close(out.detach().cpu(), cpu_out, **TOL[dtype])


def test_flex_score_mod_and_gqa_match_cpu_math():
    q, k, v = _qkv(torch.float32, heads_q=4, heads_kv=2)
    out, inputs = _run_neuron(q, k, v, causal, score_mod=alibi_like)
    ref, ref_inputs = _reference(q, k, v, causal, score_mod=alibi_like)
    _check_forward_backward(out, inputs, ref, ref_inputs, TOL[torch.float32])


def test_flex_causal_equals_sdpa():
    q, k, v = _qkv(torch.float32)
    out, _ = _run_neuron(q, k, v, causal)
    torch.testing.assert_close(out.detach().cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_flex_document_mask_equals_sdpa_with_dense_mask():
    q, k, v = _qkv(torch.float32)
    out, _ = _run_neuron(q, k, v, _document_mask("neuron"))
    dense = create_mask(_document_mask("cpu"), None, None, L, L, device="cpu")
    torch.testing.assert_close(out.detach().cpu(), F.scaled_dot_product_attention(q, k, v, attn_mask=dense))


def test_flex_under_autocast_like_cuda():
    q, k, v = _qkv(torch.float32)
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    block_mask = create_block_mask(causal, None, None, L, L, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = flex_attention(qn, kn, vn, block_mask=block_mask)
    # CUDA's autocast kernel casts q/k/v to the autocast dtype; the gradients stay float32.
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert qn.grad.dtype == torch.float32 and torch.isfinite(qn.grad).all()
    ref = flex_attention(
        *(t.bfloat16() for t in (q, k, v)), block_mask=create_block_mask(causal, None, None, L, L, device="cpu")
    )
    torch.testing.assert_close(out.detach().cpu(), ref)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_flex_compiled_training_matches_cpu_math(backend, fresh_dynamo):
    q, k, v = _qkv(torch.float32, heads_q=4, heads_kv=2)
    # torchtitan's class-level compile of flex_attention, with its Inductor options.
    options = {"max_autotune": True, "coordinate_descent_tuning": True} if backend == "inductor" else None
    compiled = torch.compile(flex_attention, backend=backend, fullgraph=True, options=options)
    # A cached graph would skip the lowering under test.
    with torch._inductor.config.patch(fx_graph_cache=False):
        out, inputs = _run_neuron(q, k, v, sliding_window, score_mod=alibi_like, fn=compiled)
    ref, ref_inputs = _reference(q, k, v, sliding_window, score_mod=alibi_like)
    _check_forward_backward(out, inputs, ref, ref_inputs, dict(atol=1e-4, rtol=1e-4))


@pytest.mark.slow
def test_flex_compiled_block_mask_creation(fresh_dynamo):
    mask = torch.compile(create_block_mask)(_document_mask("neuron"), None, None, L, L, device="neuron")
    eager = create_block_mask(_document_mask("neuron"), None, None, L, L, device="neuron")
    torch.testing.assert_close(mask.to_dense().cpu(), eager.to_dense().cpu())


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_flex_flash_backend_is_refused_with_the_way_out(backend, fresh_dynamo):
    q, k, v = _qkv(torch.float32)
    fn = flex_attention if backend is None else torch.compile(flex_attention, backend=backend)
    # Compiled, Inductor wraps the error in its own; the message is the same.
    with pytest.raises(Exception, match="CUDA-only.*attn_backend 'flex' or 'varlen'"):
        _run_neuron(q, k, v, causal, fn=fn, kernel_options={"BACKEND": "FLASH"})


@pytest.mark.parametrize("built_for", [32, 128])
def test_block_mask_for_another_length_names_the_fix(built_for):
    q = torch.randn(1, 2, L, D, device="neuron")
    block_mask = create_block_mask(causal, None, None, built_for, built_for, device="neuron")
    with pytest.raises(ValueError, match="block_mask was created for .* new block mask"):
        flex_attention(q, q, q, block_mask=block_mask)


def test_untraceable_score_mod_fails_as_on_cpu():
    def uses_item(score, b, h, q, kv):
        return score * float(q.item())

    errors = []
    for device in ("cpu", "neuron"):
        q = torch.randn(1, 2, L, D, device=device)
        with pytest.raises(RuntimeError, match="vmap.*item") as info:
            flex_attention(q, q, q, score_mod=uses_item)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_validate_device_relaxation_is_narrow():
    fa = sys.modules["torch.nn.attention.flex_attention"]
    original = fa._validate_device.__wrapped__
    # PyTorch's check, as this relaxation was written against. If this fails, PyTorch changed
    # _validate_device: re-read it, then update torch_neuronx._compat and this text.
    source = inspect.getsource(original)
    assert 'supported_devices = {"cuda", "cpu", "xpu", "hpu", "mps"}' in source
    assert torch.__version__.startswith(_compat.FLEX_VALIDATE_DEVICE_TORCH)
    # Every other device still gets PyTorch's own check.
    meta = torch.empty(1, 1, 8, 8, device="meta")
    with pytest.raises(ValueError, match="Found input tensors on meta device"):
        fa._validate_device(meta, meta, meta)
    cpu = torch.zeros(1, 1, 8, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        fa._validate_device(cpu, cpu, cpu)
    neuron = torch.zeros(1, 1, 8, 8, device="neuron", requires_grad=True)
    assert fa._validate_device(neuron, neuron, neuron) is None


# --------------------------------------------------------------------------- #
# varlen_attn
# --------------------------------------------------------------------------- #

SEQ_LENGTHS = (5, 11, 16)


def _packed(heads_q, heads_kv, dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    total = sum(SEQ_LENGTHS)
    q = torch.randn(total, heads_q, D, generator=g).to(dtype)
    k, v = (torch.randn(total, heads_kv, D, generator=g).to(dtype) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(SEQ_LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu


def _per_sequence_sdpa(q, k, v, cu, is_causal):
    outs = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seq = [t[start:end].transpose(0, 1) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*seq, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1])
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("heads_kv", [4, 2])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_varlen_forward_backward_equal_per_sequence_sdpa(window, heads_kv):
    q, k, v, cu = _packed(4, heads_kv)
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    cun = cu.to("neuron")
    out = varlen_attn(
        qn, kn, vn, cun, cun, max(SEQ_LENGTHS), max(SEQ_LENGTHS), window_size=window, enable_gqa=heads_kv != 4
    )
    assert out.device.type == "neuron"
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _per_sequence_sdpa(*ref_inputs, cu, is_causal=window == (-1, 0))
    torch.testing.assert_close(out.detach().cpu(), ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn(out.shape)
    out.backward(grad.to("neuron"))
    ref.backward(grad)
    for got, want in zip((qn, kn, vn), ref_inputs):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)


def test_varlen_sliding_window_matches_dense_mask():
    q, k, v, cu = _packed(4, 4)
    cun = cu.to("neuron")
    out = varlen_attn(*(t.to("neuron") for t in (q, k, v)), cun, cun, 16, 16, window_size=(3, 0))
    seq = [t[5:16].transpose(0, 1) for t in (q, k, v)]
    i, j = torch.arange(11).unsqueeze(1), torch.arange(11).unsqueeze(0)
    ref = F.scaled_dot_product_attention(*seq, attn_mask=(j <= i) & (j >= i - 3)).transpose(0, 1)
    torch.testing.assert_close(out[5:16].cpu(), ref)


def test_varlen_return_aux_lse():
    from torch.nn.attention.varlen import AuxRequest

    q, k, v, cu = _packed(4, 4)
    cun = cu.to("neuron")
    _, lse = varlen_attn(*(t.to("neuron") for t in (q, k, v)), cun, cun, 16, 16, return_aux=AuxRequest(lse=True))
    scores = q[:5].transpose(0, 1) @ k[:5].transpose(0, 1).transpose(-1, -2) / D**0.5
    torch.testing.assert_close(lse[:, :5].cpu(), torch.logsumexp(scores, -1))


@pytest.mark.slow
def test_varlen_compiled_training(fresh_dynamo):
    q, k, v, cu = _packed(4, 2)
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    cun = cu.to("neuron")

    @torch.compile(backend="neuron")
    def step(q, k, v):
        return varlen_attn(q, k, v, cun, cun, 16, 16, window_size=(-1, 0), enable_gqa=True).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(qn, kn, vn).backward()
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    _per_sequence_sdpa(*ref_inputs, cu, is_causal=True).sum().backward()
    for got, want in zip((qn, kn, vn), ref_inputs):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)


def test_validate_device_relaxation_only_on_the_torch_it_was_written_for(monkeypatch):
    import types

    def check(query, key, value):
        raise ValueError("PyTorch's own check")

    module = types.SimpleNamespace(_validate_device=check)
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    _compat.relax_flex_attention_device_check(module)
    assert module._validate_device is check
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    _compat.relax_flex_attention_device_check(module)
    assert module._validate_device.__wrapped__ is check


@pytest.mark.slow
def test_flex_compiled_under_autocast_with_document_mask(fresh_dynamo):
    q, k, v = _qkv(torch.float32, heads_q=4, heads_kv=2)
    compiled = torch.compile(flex_attention, backend="neuron", fullgraph=True)
    with torch.autocast("neuron", dtype=torch.bfloat16), torch._inductor.config.patch(fx_graph_cache=False):
        out, inputs = _run_neuron(q, k, v, _document_mask("neuron"), fn=compiled)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(t.grad.dtype == torch.float32 for t in inputs)
    ref, _ = _reference(*(t.bfloat16() for t in (q, k, v)), _document_mask("cpu"))
    torch.testing.assert_close(out.detach().cpu().double(), ref, atol=2e-2, rtol=2e-2)
