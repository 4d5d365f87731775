"""The readiness package's shape: five wings that import only what their docstrings allow, private
PyTorch only in ``_torch_private.py``, few modules at the top, no class over 150 lines and no function over 60."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READINESS = ROOT / "torch_neuronx" / "readiness"
PACKAGE = "torch_neuronx.readiness"
WINGS = ("launch", "record", "dry", "estimate", "report")
# What each wing may import of the others (and of the package's one private-PyTorch module).
ALLOWED = {
    "launch": {"record", "dry", "report", "estimate", "_torch_private"},
    "record": {"_torch_private"},
    "dry": {"record", "_torch_private"},
    "estimate": {"record"},
    "report": {"record", "estimate"},
    "_torch_private": set(),
}
TOP_MODULES = {"__init__.py", "_torch_private.py"}
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60
# Private-looking attributes that are not PyTorch's: namedtuple's API, argparse's list of a
# parser's actions (torchrun's parser, read to rebuild its flags).
NOT_TORCH = {"_make", "_asdict", "_fields", "_replace", "_actions"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(line, absolute module) of every import in `path`, relative ones resolved, at any depth."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            yield from ((node.lineno, n) for n in names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def _part(module: str) -> str | None:
    """The wing (or top module) of readiness a module belongs to, or None outside readiness."""
    if not module.startswith(PACKAGE + "."):
        return None
    return module[len(PACKAGE) + 1 :].split(".")[0]


def _wing_offenders(root: Path) -> list:
    out = []
    for path in sorted(root.rglob("*.py")):
        me = _part(_module(path))
        if me not in ALLOWED:
            continue
        for line, module in _imports(path):
            other = _part(module)
            if other is not None and other != me and other not in ALLOWED[me]:
                out.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {other} ({module})")
    return out


def test_each_wing_imports_only_what_it_may():
    assert {p.name for p in READINESS.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(WINGS)
    assert _wing_offenders(READINESS) == []


def test_each_wing_says_what_it_owns_and_may_import():
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((READINESS / wing / "__init__.py").read_text()))
        assert doc and "May import" in doc, wing


def test_at_most_three_modules_at_the_top():
    top = {p.name for p in READINESS.glob("*.py")}
    assert top == TOP_MODULES and len(top) <= 3


def _private_torch(path: Path) -> list:
    """Private PyTorch in `path`: imports of a private torch module (torch._x, torch.a._b,
    torch.testing._internal), private attributes of torch modules or of names imported from torch,
    and private attributes of any other object not the file's own (self, cls) or this package's."""
    tree = ast.parse(path.read_text(), filename=str(path))
    torch_names, own_names, found = set(), set(), []
    op_namespaces = {  # `_aten = torch.ops.aten`: its attributes are op names
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and ast.unparse(node.value).startswith("torch.ops.")
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                (torch_names if a.name.split(".")[0] == "torch" else own_names).add((a.asname or a.name).split(".")[0])
                if a.name.split(".")[0] == "torch" and any(p.startswith("_") for p in a.name.split(".")[1:]):
                    found.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            is_torch = not node.level and module.split(".")[0] == "torch"
            for a in node.names:
                (torch_names if is_torch else own_names).add(a.asname or a.name)
            if is_torch and any(p.startswith("_") for p in module.split(".")[1:] + [a.name for a in node.names]):
                found.append(f"{node.lineno}: from {module} import {', '.join(a.name for a in node.names)}")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        name = root.id if isinstance(root, ast.Name) else None
        chain = ast.unparse(node)
        if name in ("self", "cls") or node.attr in NOT_TORCH or chain.startswith("torch.ops.") or name in op_namespaces:
            continue  # the file's own objects; ATen op names (aten._to_copy) are public ops
        if name in own_names and name not in torch_names:
            continue  # this package's modules, or another library's (safetensors' own names)
        found.append(f"{node.lineno}: {chain[:80]}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_private_pytorch_only_in_torch_private():
    offenders = {
        str(p.relative_to(ROOT)): found
        for p in sorted(READINESS.rglob("*.py"))
        if p.name != "_torch_private.py" and (found := _private_torch(p))
    }
    assert offenders == {}


def test_the_private_pytorch_rule_sees_what_it_forbids(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\nimport torch._dynamo\nfrom torch.utils._pytree import tree_leaves\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "def f(module, t):\n    c10d._rank_not_in_group(None)\n    torch._C._foo()\n"
        "    return module._parameters, self_ok(t), torch.ops.aten._to_copy\n"
    )
    found = _private_torch(tmp_path / "m.py")
    assert [f.split(":")[0] for f in found] == ["2", "3", "6", "7", "7", "8"], found
    assert "import torch._dynamo" in found[0] and "module._parameters" in found[-1]


def test_no_class_is_longer_than_the_limit():
    long = {}
    for path in sorted(READINESS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}, f"split these classes (at most {MAX_CLASS_LINES} lines each), one concern each"


def test_no_function_is_longer_than_the_limit():
    long = {}
    for path in sorted(READINESS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > MAX_FUNCTION_LINES:
                long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}, f"split these functions (at most {MAX_FUNCTION_LINES} lines each)"
