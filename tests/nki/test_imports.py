"""The NKI package's module graph has no cycles, and NumPy-only NKI needs no torch."""

import ast
import os
import subprocess
import sys

import torch_neuronx.nki as nki_pkg
from torch_neuronx.nki import _alias

NKI_DIR = os.path.dirname(nki_pkg.__file__)


def _module_graph():
    """Edges ``module -> imported sibling`` from every import statement, including
    imports inside functions (those hide cycles rather than remove them)."""
    mods = {f[:-3] for f in os.listdir(NKI_DIR) if f.endswith(".py") and f != "__init__.py"}
    graph = {}
    for m in mods:
        tree = ast.parse(open(os.path.join(NKI_DIR, m + ".py")).read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch_neuronx.nki."):
                deps.add(node.module.split(".")[2])
        graph[m] = deps & mods
    return graph


def _find_cycle(graph):
    state = {}

    def visit(n, path):
        state[n] = "open"
        for d in sorted(graph[n]):
            if state.get(d) == "open":
                return path[path.index(d) :] + [d] if d in path else path + [d]
            if d not in state:
                c = visit(d, path + [d])
                if c:
                    return c
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n, [n])
            if c:
                return c
    return None


def test_cycle_finder_finds_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_nki_modules_import_without_cycles():
    graph = _module_graph()
    assert {"language", "isa", "_tensor", "_ops", "_simulator"} <= set(graph)
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph))}"


def test_import_nki_in_a_fresh_interpreter_without_torch(tmp_path):
    # What the torch_neuronx_nki.pth start-up file runs, then a NumPy-only tutorial file.
    script = (
        _alias.pth_line()
        + """
import sys
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.isa as nisa
from neuronxcc.nki.typing import tensor
import nki as nki2
import numpy as np
assert nki2 is nki

@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out

x = np.arange(12, dtype=np.float32).reshape(3, 4)
assert (add(x, x) == 2 * x).all()
assert "torch" not in sys.modules, "NumPy-only NKI imported torch"
print("ok")
"""
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(NKI_DIR))
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_write_pth(tmp_path):
    path = _alias.write_pth(str(tmp_path))
    assert open(path).read() == _alias.pth_line()
