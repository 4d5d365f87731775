"""torch.neuron (torch_neuronx/neuron) does not import upward from the rest of torch_neuronx, and
neuronsim (the NKI simulator, hardware table and settings registry) imports neither torch nor
torch_neuronx."""

import ast
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_neuronx"
NEURONSIM = ROOT / "neuronsim"
# neuronsim is torch-free: nothing in it may import these, not even inside a function.
NEURONSIM_FORBIDDEN = ("torch", "torch_neuronx")
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


def _top_level_imports(path: Path):
    """(line, top-level package) of every absolute import in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def _neuronsim_offenders(root: Path):
    return [
        f"{path.relative_to(root)}:{line}: import {top}"
        for path in sorted(root.rglob("*.py"))
        for line, top in _top_level_imports(path)
        if top in NEURONSIM_FORBIDDEN
    ]


def test_neuronsim_imports_neither_torch_nor_torch_neuronx():
    assert len(list(NEURONSIM.rglob("*.py"))) > 20  # the scan sees the package
    assert _neuronsim_offenders(NEURONSIM) == []


def test_the_neuronsim_rule_sees_hidden_imports(tmp_path):
    (tmp_path / "m.py").write_text(
        "import numpy\ndef f():\n    import torch.nn\n    from torch_neuronx import nki\n    return numpy\n"
    )
    assert _neuronsim_offenders(tmp_path) == ["m.py:3: import torch", "m.py:4: import torch_neuronx"]


def test_dynamo_metrics_are_lent_to_torch_neuron():
    from torch_neuronx import _dynamo

    assert torch.neuron.get_dynamo_metrics is _dynamo.get_dynamo_metrics
    assert torch.neuron.reset_dynamo_metrics is _dynamo.reset_dynamo_metrics


# -- readiness sits above every other layer ------------------------------------------------------
READINESS = PACKAGE / "readiness"
# The package's entry points, above readiness: `torch_neuronx.readiness` and `torch-neuronx check`.
READINESS_IMPORTERS = {PACKAGE / "__init__.py", PACKAGE / "cli.py"}
# What readiness may import of the rest of the package (documented in readiness/__init__.py):
# the core, where calls come from, memory counters, the compiled-graph listener, and the hooks
# a dry run installs its overrides through.
READINESS_USES = {"_C", "_sites", "neuron", "profiler", "distributed", "_dynamo"}


def _absolute_imports(path: Path):
    """(line, module) of every import of torch_neuronx in `path`, relative ones resolved."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = package[:-1] if package[-1] == "__init__" else package
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            yield from ((node.lineno, n) for n in names if n.startswith("torch_neuronx"))
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.startswith("torch_neuronx"))


def test_nothing_below_readiness_imports_it():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(READINESS) and path not in READINESS_IMPORTERS
        for line, module in _absolute_imports(path)
        if module == "torch_neuronx.readiness" or module.startswith("torch_neuronx.readiness.")
    ]
    assert offenders == []


def test_readiness_imports_only_what_it_documents():
    used = {
        module.split(".")[1]
        for path in READINESS.rglob("*.py")
        for _, module in _absolute_imports(path)
        if module.count(".") >= 1 and module.split(".")[1] != "readiness"
    }
    assert used <= READINESS_USES, sorted(used - READINESS_USES)
    doc = (READINESS / "__init__.py").read_text()
    assert all(f"``{name}``" in doc for name in READINESS_USES)


def test_the_import_resolver_sees_relative_imports():
    found = {m for _, m in _absolute_imports(READINESS / "record" / "observers" / "memory.py")}
    # `from .... import _C`, `from ....neuron import memory`, `from ..ledger import PEAK_STEP`
    assert {"torch_neuronx._C", "torch_neuronx.neuron", "torch_neuronx.readiness.record.ledger"} <= found
