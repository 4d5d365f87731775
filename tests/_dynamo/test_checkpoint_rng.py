"""torch.compile(backend="neuron") through activation checkpointing around random ops.

The partitioner recomputes checkpointed dropout / SDPA-dropout in the backward graph
and wraps them in ``run_and_save_rng_state`` / ``run_with_rng_state`` so the replay
draws the same masks from the neuron generator (see ``_patch_rng_state_hops``).

References are eager on neuron *without* checkpointing, seeded the same way:
checkpointing must not change numerics. Inductor's ``fallback_random`` makes the
compiled graph draw from the eager neuron generator (rather than Inductor's own
seeded RNG), so the masks are bit-identical to eager: the loss then matches exactly
and gradients differ only by float re-association in Inductor's fused C++ kernels
(observed <= 2e-6; tolerance 1e-5). ``fallback_random`` is also what keeps the
random ops themselves in the graph, i.e. what exercises the RNG-state HOPs.
"""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

DEV = "neuron"
NO_FALLBACK = {"fallback_execution": False}  # a graph that fails to compile must fail the test


class _AttnBlock(nn.Module):
    """SDPA with attention dropout followed by an output dropout."""

    def __init__(self, d=16, heads=2, checkpointed=True):
        super().__init__()
        self.qkv, self.o, self.heads, self.checkpointed = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, checkpointed

    def _body(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        return F.dropout(self.o(a.transpose(1, 2).reshape(b, t, d)), 0.2, training=True)

    def forward(self, x):
        if self.checkpointed:
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


def _step(model, *inputs, seed=1, loss_fn=lambda out: (out.float() ** 2).sum()):
    torch.manual_seed(seed)
    loss = loss_fn(model(*inputs))
    loss.backward()
    return loss.detach().cpu()


def _grads(model):
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got, want):
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@inductor_config.patch(fallback_random=True)
def test_checkpointed_dropout_sdpa_matches_eager():
    torch.manual_seed(0)
    eager = _AttnBlock(checkpointed=False).to(DEV)
    compiled_model = copy.deepcopy(eager)
    compiled_model.checkpointed = True
    x = torch.randn(2, 8, 16, device=DEV, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()

    want = _step(eager, x)
    state_eager = torch.neuron.get_rng_state()
    got = _step(torch.compile(compiled_model, backend="neuron", options=NO_FALLBACK), x2)
    state_compiled = torch.neuron.get_rng_state()

    # Gradients depend on the masks of the forward recomputed in backward: had the
    # replay drawn fresh masks, they would not match the non-checkpointed model's. The
    # loss itself is Inductor's reduction against eager's: equal up to rounding (on CPUs
    # with AVX-512 the two sum in another order), far closer than another mask would make it.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    _assert_grads_close(_grads(compiled_model), _grads(eager))
    torch.testing.assert_close(x2.grad.cpu(), x.grad.cpu(), rtol=1e-5, atol=1e-5)
    # The replay restores the generator afterwards: like eager without
    # checkpointing, the step consumed only the forward's random numbers.
    assert torch.equal(state_compiled, state_eager)
    # The masks really were random: a different seed gives a loss far from this one.
    assert abs(_step(eager, x, seed=2) - want) > 1e-3 * abs(want)


def _tiny_llama(attention_dropout):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=attention_dropout,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).train()


@pytest.mark.slow
@inductor_config.patch(fallback_random=True)
def test_llama_gradient_checkpointing_compiled_training_step():
    eager = _tiny_llama(attention_dropout=0.25).to(DEV)
    compiled_model = copy.deepcopy(eager)
    compiled_model.gradient_checkpointing_enable()
    assert compiled_model.is_gradient_checkpointing and not eager.is_gradient_checkpointing
    ids = torch.randint(2, 128, (2, 12), generator=torch.Generator().manual_seed(3)).to(DEV)

    def loss_fn(out):
        return out.loss

    want = _step(lambda i: eager(input_ids=i, labels=i), ids, seed=11, loss_fn=loss_fn)
    compiled = torch.compile(compiled_model, backend="neuron", options=NO_FALLBACK)
    got = _step(lambda i: compiled(input_ids=i, labels=i), ids, seed=11, loss_fn=loss_fn)

    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    _assert_grads_close(_grads(compiled_model), _grads(eager))
    # Dropout was active: another seed changes the eager loss.
    torch.manual_seed(12)
    with torch.no_grad():
        assert not torch.equal(eager(input_ids=ids, labels=ids).loss.cpu(), want)
