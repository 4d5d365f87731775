"""torch.neuron (torch_neuronx/neuron) does not import upward from the rest of torch_neuronx."""

import ast
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[2] / "torch_neuronx"
# The C++ core and the profiler (device events and compiled-graph spans, which sit below
# every layer that runs ops) are below the device module.
ALLOWED = {"_C", "profiler"}


def _imports_of(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 2:  # from ..x import y / from .. import y
                yield from ([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.level == 0 and node.module and node.module.startswith("torch_neuronx."):
                yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch_neuronx."):
                    yield a.name.split(".")[1]


def test_device_module_imports_only_the_core():
    offenders = {}
    for path in sorted((PACKAGE / "neuron").glob("*.py")):
        bad = sorted(set(_imports_of(path)) - ALLOWED)
        if bad:
            offenders[path.name] = bad
    assert offenders == {}


def test_dynamo_metrics_are_lent_to_torch_neuron():
    from torch_neuronx import _dynamo

    assert torch.neuron.get_dynamo_metrics is _dynamo.get_dynamo_metrics
    assert torch.neuron.reset_dynamo_metrics is _dynamo.reset_dynamo_metrics
