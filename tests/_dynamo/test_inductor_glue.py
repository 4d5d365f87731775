"""Inductor glue: neuron graphs take the C++ backend's (CPU's) lowering choices."""

import pytest
import torch


def _relative_bias_with_sinks(scores, rel, sinks):
    # inkling2's sliding attention at decode step 6: a relative-position bias gathered
    # with a clamped query-key distance, then one attention-sink logit per query.
    q_pos = torch.arange(1, device=scores.device) + 6
    kv_pos = torch.arange(scores.shape[-1], device=scores.device)
    distance = (q_pos[:, None] - kv_pos[None, :])[None, None]
    bias = rel.gather(-1, distance.clamp(0, rel.shape[-1] - 1).expand(*scores.shape[:2], -1, -1))
    logits = torch.cat([scores + bias, sinks], dim=-1).float()
    return torch.softmax(logits, dim=-1)[..., :-1]


def test_cat_of_gathered_bias_into_softmax_compiles_like_cpu(fresh_dynamo):
    # Regression (inkling2_text, static-cache decode): Inductor lowers aten.cat as a
    # masked "pointwise cat" on every device but CPU; fused into the softmax's max
    # reduction, its Identity()-wrapped index meets the clamped gather index and
    # simplify_loops fails with "ValueError: The argument '6 - ((0))' is not comparable"
    # (CPU Inductor fails the same way with config.force_pointwise_cat=True). Neuron
    # lowers cat as CPU does (a ConcatKernel), so it compiles and matches CPU.
    g = torch.Generator().manual_seed(0)
    args = [
        torch.randn(1, 4, 1, 8, generator=g),
        torch.randn(1, 4, 1, 16, generator=g),
        torch.randn(1, 4, 1, 1, generator=g),
    ]
    expected = _relative_bias_with_sinks(*args)

    out = torch.compile(_relative_bias_with_sinks, backend="neuron")(*[a.to("neuron") for a in args])

    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), expected)
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["graphs_compiled"] == 1 and not metrics["fallbacks"]


def _refusal(call):
    """The NotImplementedError an AOT entry point raised (Inductor wraps it in InductorError)."""
    from torch._inductor.exc import InductorError

    try:
        call()
    except InductorError as e:
        assert isinstance(e.inner_exception, NotImplementedError), repr(e.inner_exception)
        return str(e.inner_exception)
    raise AssertionError("compiled for neuron ahead of time")


def test_aotinductor_refuses_neuron_naming_what_to_use(fresh_dynamo, tmp_path):
    import torch._export

    model = torch.nn.Linear(4, 4).to("neuron")
    x = torch.randn(2, 4, device="neuron")
    exported = torch.export.export(model, (x,))
    messages = [
        _refusal(lambda: torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "m.pt2"))),
        _refusal(lambda: torch._export.aot_compile(model, (x,))),
    ]
    for message in messages:
        assert "AOTInductor does not support device 'neuron'" in message, message
        assert 'torch.compile(model, backend="neuron")' in message and "torch.export.export" in message, message
    assert not (tmp_path / "m.pt2").exists()
    with pytest.raises(RuntimeError, match="Unsupported device neuron"):  # PyTorch's own refusal
        torch._export.aot_load(str(tmp_path / "m.so"), "neuron")


def test_cpp_wrapper_refuses_neuron(fresh_dynamo):
    model = torch.nn.Linear(4, 4).to("neuron")
    message = _refusal(lambda: torch.compile(model, options={"cpp_wrapper": True})(torch.randn(2, 4, device="neuron")))
    assert "cpp_wrapper=True" in message and 'backend="neuron"' in message, message
