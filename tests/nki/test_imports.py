"""neuronsim (the NKI simulator, the hardware table, the settings registry) never imports torch,
the NKI package's module graph has no cycles, and the ``nki`` name alias defers to a real NKI."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import neuronsim.nki as nki_pkg

NKI_DIR = os.path.dirname(nki_pkg.__file__)
ROOT = Path(__file__).resolve().parents[2]


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
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("neuronsim.nki."):
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


def _python(code, tmp_path, pythonpath=()):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, pythonpath)])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_neuronsim_runs_a_kernel_without_torch(tmp_path):
    code = """
import sys
import neuronsim, neuronsim.hardware, neuronsim.settings
import neuronsim.nki as nki, neuronsim.nki.language as nl, neuronsim.nki.isa as nisa
from neuronsim.nki.kernels import nki_softmax
import numpy as np

@nki.jit
def scale_add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nisa.tensor_scalar(nl.add(nl.load(a), nl.load(b)), op0=nl.multiply, operand0=2.0))
    return out

x = np.arange(12, dtype=np.float32).reshape(3, 4)
assert (scale_add(x, x) == 4 * x).all()
e = np.exp(x - x.max(-1, keepdims=True))
np.testing.assert_allclose(nki_softmax(x), e / e.sum(-1, keepdims=True), rtol=1e-5)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torch_neuronx")))
"""
    assert _python(code, tmp_path) == "[]"


def test_nki_alias_defers_to_a_real_installation(tmp_path):
    # Stand-ins for AWS's packages on the path: the alias must never shadow them.
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "neuronxcc").mkdir()
    (tmp_path / "neuronxcc" / "__init__.py").write_text("REAL = True\n")
    code = (
        "import neuronsim._alias as a; a.install()\n"
        "import nki, neuronxcc\n"
        "print(nki.REAL, neuronxcc.REAL, hasattr(nki, 'jit'))\n"
    )
    assert _python(code, tmp_path, pythonpath=[tmp_path]) == "True True False"


def test_alias_replaces_an_older_releases_finder(tmp_path):
    # An older release's start-up file installed a finder for a torch_neuronx.nki that no
    # longer exists; install() must take its place rather than defer to it.
    code = (
        "import sys\n"
        "class Old:\n"
        "    _torch_neuronx_nki_alias = True\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        assert name.split('.')[0] != 'nki', 'the old finder was asked for ' + name\n"
        "sys.meta_path.insert(0, Old())\n"
        "import neuronsim._alias as a; a.install(); a.install()\n"
        "import nki.language\n"
        "print(sum(type(f).__name__ in ('Old', '_AliasFinder') for f in sys.meta_path), nki.__name__)\n"
    )
    assert _python(code, tmp_path) == "1 neuronsim.nki"
