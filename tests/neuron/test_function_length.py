"""No function in the packages is longer than MAX_LINES: split long ones where they mix concerns."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "torch_neuronx", ROOT / "neuronsim")  # the distribution's two packages
# Tutorial kernels mirror AWS's NKI samples line for line.
EXCLUDED = (ROOT / "neuronsim" / "nki" / "kernels",)
MAX_LINES = 80
# readiness grows with every new kind of script and cost term: its functions stay shorter still.
READINESS = ROOT / "torch_neuronx" / "readiness"
READINESS_MAX_LINES = 60


def _function_lengths(path: Path):
    """(qualified name, lines from `def` to the last line) of every function in `path`, nested ones too."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(path.read_text(), filename=str(path)), "")


def _long_functions():
    found = {}
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        if any(path.is_relative_to(e) for e in EXCLUDED):
            continue
        limit = READINESS_MAX_LINES if path.is_relative_to(READINESS) else MAX_LINES
        for name, lines in _function_lengths(path):
            if lines > limit:
                found[f"{path.relative_to(ROOT)}:{name}"] = lines
    return found


def test_no_function_is_longer_than_the_limit():
    assert (
        _long_functions() == {}
    ), f"split these into functions of at most {MAX_LINES} lines ({READINESS_MAX_LINES} in readiness/), one concern each"


def test_lengths_count_nested_functions_and_methods(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("class A:\n    def f(self):\n        def g():\n            pass\n        return g\n")
    assert dict(_function_lengths(sample)) == {"A.f": 4, "A.f.g": 2}
