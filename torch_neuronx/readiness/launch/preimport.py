"""Importing what a script imports, once, before a dry run forks its ranks (they share it copy-on-write)."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os

_HEAVY_PREFIXES = (
    "torch",
    "torch_neuronx",
    "transformers",
    "trl",
    "accelerate",
    "peft",
    "diffusers",
    "datasets",
    "numpy",
)


def _module_path(name: str) -> str | None:
    """The file ``python -m name`` runs, found without importing anything: importlib's find_spec
    imports a dotted name's parent packages, and a package that captures ``sys.argv`` when
    imported (torchtitan's ``parse_args(args=sys.argv[1:])``) would keep the scheduler's own."""
    spec, search = None, None
    for part in name.split("."):
        if spec is not None and search is None:
            return None  # a module, not a package: it has no submodules
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = spec.submodule_search_locations
    if search is not None:  # a package: -m runs its __main__
        spec = importlib.machinery.PathFinder.find_spec("__main__", search)
    return spec.origin if spec is not None else None


def _script_path(target: list[str]) -> str | None:
    return _module_path(target[1]) if target[0] == "-m" else target[0]


def preimport(target: list[str]) -> list[str]:
    """Imports the libraries the script imports anywhere (at its top or inside functions), and
    the names it imports from them (libraries such as transformers and trl load those lazily),
    so the forked ranks share them. Returns the modules imported."""
    path = _script_path(target)
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    wanted: dict = {}  # module -> names imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                wanted.setdefault(a.name, [])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted.setdefault(node.module, []).extend(a.name for a in node.names)
    done = []
    for name, attrs in wanted.items():
        if name.split(".")[0] not in _HEAVY_PREFIXES:
            continue
        try:
            module = importlib.import_module(name)
            for attr in attrs:
                getattr(module, attr, None)
            done.append(name)
        except Exception:  # the rank will raise it where the script imports it
            pass
    # What every dry-run rank imports: the fake tensor mode and Dynamo under it.
    importlib.import_module("torch._subclasses.fake_tensor")
    importlib.import_module("torch._dynamo")
    return done
