"""The examples/nki scripts run, match PyTorch and print a cost comparison."""

import pathlib
import runpy
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki"


@pytest.mark.parametrize("name", ["add", "matmul", "softmax", "rmsnorm", "layernorm", "attention"])
def test_example_runs(name, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "trn2"])
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "matches PyTorch" in out and "on neuron:0" in out
    assert "NKI cost estimate on trn2" in out and "Unfused PyTorch estimate" in out
    assert "estimated speedup" in out
