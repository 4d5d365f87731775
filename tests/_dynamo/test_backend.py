"""torch.compile(backend="neuron"): registration, parity, static shapes, errors, options, metrics."""

import os

import pytest
import torch
import torch._dynamo
from torch import nn

import torch_neuronx
from helpers import MLP, run_python
from torch_neuronx._dynamo import (
    NeuronCompileOptionError,
    NeuronCpuInputError,
    NeuronDynamicShapeError,
    NeuronGraphCompilationError,
)

DEV = "neuron"


def _mlp(device=DEV):
    torch.manual_seed(0)
    return MLP().to(device)


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- #
# Registration
# --------------------------------------------------------------------------- #


@pytest.mark.slow
def test_registered_lazily_by_name():
    r = run_python(
        "import sys, torch\n"
        "assert 'torch._dynamo' not in sys.modules, 'import torch must not load Dynamo'\n"
        "import torch._dynamo\n"
        "print('neuron' in torch._dynamo.list_backends())\n"
        "print(torch.compile(lambda x: x * 2, backend='neuron')(torch.ones(2, device='neuron')).sum().item())\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "4.0"]


def test_entry_point_declared():
    from pathlib import Path

    import tomllib

    from torch_neuronx._dynamo import neuron_backend

    pyproject = Path(torch_neuronx.__file__).parents[1] / "pyproject.toml"
    eps = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"neuron": "torch_neuronx._dynamo:neuron_backend"}
    assert callable(neuron_backend)


def test_metrics_exported_from_torch_neuron():
    assert torch.neuron.get_dynamo_metrics is torch_neuronx._dynamo.get_dynamo_metrics
    assert callable(torch.neuron.reset_dynamo_metrics)


def test_version_check_names_versions():
    from torch_neuronx._dynamo import _inductor_glue as glue

    glue.check_torch_version()  # the installed torch is supported
    with pytest.raises(glue.UnsupportedTorchVersionError, match="2.13.*2.14.0"):
        glue.check_torch_version("2.14.0")


# --------------------------------------------------------------------------- #
# Parity and execution
# --------------------------------------------------------------------------- #


def test_mlp_inference_parity():
    model = _mlp().eval()
    x = torch.randn(16, 32, device=DEV)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="neuron")(x)
    assert out.device.type == DEV
    _close(out, ref)
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] == 1 and m["recompilations"] == []


def test_runs_generated_code_not_eager_ops():
    def chain(x):
        for _ in range(10):
            x = torch.sin(x) * 1.01 + 0.1
        return x

    x = torch.randn(1000, device=DEV)
    fn = torch.compile(chain, backend="neuron")
    fn(x)  # compile
    torch_neuronx.clear_op_tracking()
    out = fn(x)
    ops = torch_neuronx.get_executed_ops()
    assert not any("sin" in op or "mul" in op or "add" in op for op in ops), ops
    _close(out, chain(x))


def test_training_loop_tracks_eager():
    g = torch.Generator().manual_seed(1)
    # Eight steps on one batch, so the loss must fall.
    xs = torch.randn(16, 32, generator=g).expand(8, 16, 32)
    ys = torch.randint(0, 10, (16,), generator=g).expand(8, 16)
    losses = {}
    for mode in ("eager", "compiled"):
        model = _mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step_model = torch.compile(model, backend="neuron") if mode == "compiled" else model
        losses[mode] = []
        for x, y in zip(xs, ys):
            loss = nn.functional.cross_entropy(step_model(x.to(DEV)), y.to(DEV))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[mode].append(loss.item())
        assert next(model.parameters()).grad.device.type == DEV
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-4, atol=1e-5)
    assert losses["compiled"][-1] < losses["compiled"][0]


def test_compiled_optimizer_step_matches_eager():
    models = [_mlp(), _mlp()]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True) for m in models]
    x = torch.randn(4, 32, device=DEV)
    for m in models:
        m(x).pow(2).sum().backward()
    opts[0].step()

    @torch.compile(backend="neuron")
    def step():
        opts[1].step()

    step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        _close(b, a)
    assert torch.neuron.get_dynamo_metrics()["graphs_compiled"] >= 1


def test_autocast_bf16():
    model = _mlp().eval()
    x = torch.randn(8, 32, device=DEV)
    with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
        ref = model(x)
        out = torch.compile(model, backend="neuron")(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    _close(out.float(), ref.float(), tol=3e-2)


def test_model_on_another_core():
    model = _mlp("neuron:1").eval()
    x = torch.randn(8, 32, device="neuron:1")
    current = torch.neuron.current_device()
    before = torch.neuron.memory_allocated(1)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron")(x)
    assert out.device == torch.device("neuron", 1)
    assert torch.neuron.memory_allocated(1) > before  # the output lives on core 1
    assert torch.neuron.current_device() == current
    _close(out, model(x))


# --------------------------------------------------------------------------- #
# Static shapes
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dynamic", [None, False])
def test_every_new_shape_is_a_counted_compilation(dynamic):
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="neuron", dynamic=dynamic)
    for n in (4, 5, 6, 5):
        x = torch.randn(n, 3, device=DEV)
        _close(fn(x), torch.tanh(x) * 2)
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] == 3
    assert len(m["recompilations"]) == 2
    shapes = [r["shapes"] for r in m["recompilations"]]
    assert any(((5, 3), "float32", "neuron:0") in s for s in shapes), shapes
    assert any(((6, 3), "float32", "neuron:0") in s for s in shapes), shapes


def test_dynamic_true_rejected():
    fn = torch.compile(lambda x: x + 1, backend="neuron", dynamic=True)
    with pytest.raises(NeuronCompileOptionError, match=r"dynamic=True\) is not supported"):
        fn(torch.randn(4, device=DEV))


def test_mark_dynamic_names_the_input():
    def f(tokens):
        return tokens * 2

    x = torch.randn(6, 4, device=DEV)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(NeuronDynamicShapeError) as err:
        torch.compile(f, backend="neuron")(x)
    msg = str(err.value)
    assert "tokens" in msg and "dim 0" in msg
    assert "mark_static" in msg and "pad" in msg and "static" in msg


def test_mode_other_than_default_warns_and_compiles():
    with pytest.warns(UserWarning, match="only mode='default'"):
        fn = torch.compile(lambda x: x.exp(), backend="neuron", mode="max-autotune-no-cudagraphs")
        x = torch.randn(5, device=DEV)
        out = fn(x)
    _close(out, x.exp())
    assert torch.neuron.get_dynamo_metrics()["graphs_compiled"] == 1


def test_unknown_option_rejected():
    fn = torch.compile(lambda x: x + 1, backend="neuron", options={"optlevel": 3})
    with pytest.raises(NeuronCompileOptionError, match="optlevel"):
        fn(torch.randn(2, device=DEV))


# --------------------------------------------------------------------------- #
# Options: model_name, artifacts, fallback_execution
# --------------------------------------------------------------------------- #


def test_model_name_and_preserved_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    # A private cache so the graph is generated here, not loaded.
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))
    fn = torch.compile(lambda x: torch.relu(x) + 1, backend="neuron", options={"model_name": "tiny-mlp"})
    fn(torch.randn(8, device=DEV))
    dirs = [d for d in os.listdir(tmp_path) if d.startswith("tiny-mlp")]
    assert len(dirs) == 1, os.listdir(tmp_path)
    files = os.listdir(tmp_path / dirs[0])
    assert {"dynamo_graph.txt", "aot_forward_graph.txt", "forward_output_code.py"} <= set(files), files
    code = (tmp_path / dirs[0] / "forward_output_code.py").read_text()
    assert "cpp_fused" in code and "device='neuron'" in code
    assert torch.neuron.get_dynamo_metrics()["graphs"][0]["graph"].startswith("tiny-mlp")


def _break_compiler(monkeypatch):
    from torch_neuronx._dynamo import _inductor_glue as glue

    def failing(*args, **kwargs):
        raise RuntimeError("simulated compiler failure")

    monkeypatch.setattr(glue, "compile_graph", failing)


def test_failed_compile_raises_typed_error_by_default(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    _break_compiler(monkeypatch)
    fn = torch.compile(lambda x: x * 3, backend="neuron")
    with pytest.raises(NeuronGraphCompilationError, match="(?s)simulated compiler failure.*fallback_execution"):
        fn(torch.randn(3, device=DEV))


@pytest.mark.parametrize("how", ["option", "env"])
def test_fallback_execution_runs_eagerly(monkeypatch, how):
    _break_compiler(monkeypatch)
    options = None
    if how == "option":
        options = {"fallback_execution": True}
    else:
        monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    fn = torch.compile(lambda x: x * 3, backend="neuron", options=options)
    x = torch.randn(3, device=DEV)
    with pytest.warns(UserWarning, match="running it eagerly"):
        out = fn(x)
    _close(out, x * 3)
    m = torch.neuron.get_dynamo_metrics()
    assert len(m["fallbacks"]) == 1 and "simulated compiler failure" in m["fallbacks"][0]["error"]


# --------------------------------------------------------------------------- #
# CPU inputs
# --------------------------------------------------------------------------- #


def _cpu_fn(x, w):
    return torch.relu(x @ w) + torch.arange(x.shape[0], dtype=x.dtype, device=x.device)[:, None]


def test_cpu_inputs_are_copied_in(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", raising=False)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    out = torch.compile(_cpu_fn, backend="neuron")(x, w)
    assert out.device.type == DEV
    _close(out, _cpu_fn(x, w))


def test_cpu_input_is_an_error_when_autocopy_disabled(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    with pytest.raises(NeuronCpuInputError, match=r"input L\['x'\].*CPU tensor.*\.to\('neuron'\)"):
        torch.compile(_cpu_fn, backend="neuron")(torch.randn(4, 8), torch.randn(8, 3))


# --------------------------------------------------------------------------- #
# Metrics
# --------------------------------------------------------------------------- #


def test_metrics_report_graph_breaks_and_reset():
    def f(x):
        x = x.cos()
        torch._dynamo.graph_break()
        return x.sin()

    x = torch.randn(4, device=DEV)
    _close(torch.compile(f, backend="neuron")(x), f(x))
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] == 2
    assert m["graph_breaks"] >= 1 and m["graph_break_reasons"]
    assert m["compile_seconds"] > 0
    assert m["cache_hits"] + m["cache_misses"] == 2
    report = str(m)
    assert "graphs compiled      2" in report and "graph breaks" in report
    torch.neuron.reset_dynamo_metrics()
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] == 0 and m["graph_breaks"] == 0 and m["compile_seconds"] == 0
