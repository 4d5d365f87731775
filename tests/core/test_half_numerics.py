"""The simulator's half-precision numerics model, and transformers' eager-vs-SDPA check.

float16 / bfloat16 matmuls, reductions, softmax and attention accumulate in
float32 and round once to the result dtype, as Trainium's engines do. A tiny
Llama's eager and SDPA attention paths then agree within the tolerances that
transformers' ``test_eager_matches_sdpa_inference`` uses for accelerators.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF)
def test_matmuls_accumulate_in_float32(dtype):
    # k ones summed: exact in float32; a half-precision accumulator stops at 2048 (fp16) or 256 (bf16).
    k = 4096 if dtype == torch.float16 else 1024
    a = torch.ones(3, k, dtype=dtype, device="neuron")
    b = torch.ones(k, 2, dtype=dtype, device="neuron")
    for result in (
        a @ b,
        torch.mm(a, b),
        torch.bmm(a[None], b[None])[0],
        F.linear(a, b.T),
        torch.addmm(torch.zeros(3, 2, dtype=dtype, device="neuron"), a, b),
    ):
        assert result.dtype == dtype
        assert torch.equal(result.cpu(), torch.full((3, 2), float(k), dtype=dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_softmax_and_sum_round_once(dtype):
    torch.manual_seed(0)
    s = (torch.randn(16, 1000) * 5).to(dtype)
    expected = s.float().softmax(-1).to(dtype)
    assert torch.equal(s.to("neuron").softmax(-1).cpu(), expected)
    assert torch.equal(torch.ones(5000, dtype=dtype, device="neuron").sum().cpu(), torch.tensor(5000.0).to(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_sdpa_within_one_rounding_of_float32(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(*(t.to(dtype).to("neuron") for t in (q, k, v)), is_causal=True)
    # Inputs rounded to dtype, float32 inside, one rounding of the result.
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got.cpu().float(), expected, rtol=4 * eps, atol=4 * eps)


# transformers' accelerator tolerances for eager vs SDPA: (atol, rtol).
ACCEL_TOL = {torch.float16: (5e-3, 5e-3), torch.bfloat16: (1e-2, 1e-2), torch.float32: (1e-6, 1e-4)}


@pytest.mark.parametrize("dtype", list(ACCEL_TOL), ids=str)
def test_tiny_llama_eager_matches_sdpa(dtype):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(42)
    config = LlamaConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    sdpa = LlamaModel(config).eval().to("neuron", dtype)
    sdpa.set_attn_implementation("sdpa")
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    ids = torch.randint(0, 99, (7, 7)).to("neuron")
    mask = torch.ones(7, 7, dtype=torch.long)
    mask[-1, :2] = 0  # left padding in the last row, as the transformers test does
    mask = mask.to("neuron")
    with torch.no_grad():
        a = eager(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        b = sdpa(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    # Padded positions of the last row may differ (as on every device).
    a, b = a.float().cpu(), b.float().cpu()
    a[-1, :2] = b[-1, :2] = 0
    atol, rtol = ACCEL_TOL[dtype]
    torch.testing.assert_close(b, a, atol=atol, rtol=rtol)
