"""FlexAttention under a recording: one fused kernel, costed by its FLOPs; in a dry run with the
fused kernel's memory (no score matrix), as the device runs it."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

import torch_neuronx

B, H, S, D = 1, 4, 256, 64


def _causal(b, h, q, kv):
    return q >= kv


def _run(dry: bool):
    torch.neuron.empty_cache()
    with torch_neuronx.readiness(dry_run=dry) as r:
        q = torch.randn(B, H, S, D, device="neuron", requires_grad=True)
        mask = create_block_mask(_causal, B, H, S, S, device="neuron")
        flex_attention(q, q, q, block_mask=mask).sum().backward()
    return r


@pytest.mark.parametrize("dry", [False, True], ids=["real", "dry"])
def test_flex_attention_is_one_tensor_engine_kernel_each_way(dry):
    r = _run(dry)
    ops = {k.op: (k, n) for k, n in r.recording.buckets[0].ops.items()}
    (fwd, n_fwd), (bwd, n_bwd) = ops["higher_order::flex_attention"], ops["higher_order::flex_attention_backward"]
    assert (n_fwd, n_bwd) == (1, 1) and fwd.kind == bwd.kind == "tensor"
    shape = (B, H, S, D)
    assert fwd.flops == sdpa_flop_count(shape, shape, shape)
    assert bwd.flops == sdpa_backward_flop_count(shape, shape, shape, shape)
    # the math it runs on the simulator is the kernel's own: no bmm of the score matrix is counted
    assert not [o for o in ops if o.startswith("aten::bmm")]
    assert r.recording.recorder_errors == {}


def test_a_dry_run_holds_the_fused_kernels_memory_and_the_same_estimate():
    real, dry = _run(False), _run(True)
    scores = B * H * S * S * 4  # one float32 score matrix: the math path's, not the kernel's
    peak = lambda r: r.report.data["memory"][0]["peak_allocated"]  # noqa: E731
    assert peak(dry) < peak(real) - scores
    est = lambda r: r.report.data["estimates"][0]["step_seconds"]  # noqa: E731
    assert est(dry) == pytest.approx(est(real), rel=1e-9)
