"""Make ``import nki`` / ``import neuronxcc.nki`` resolve to :mod:`torch_neuronx.nki`.

The finder answers only when no other finder provides the top-level name, so a real
AWS ``nki`` / ``neuronx-cc`` installation always wins. Aliased names map to the same
module objects (no second copy of the language state).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_ALIASES = {"nki": "torch_neuronx.nki", "neuronxcc.nki": "torch_neuronx.nki"}
_NAMESPACE_PARENTS = {"neuronxcc"}


def _target(fullname):
    for alias, real in _ALIASES.items():
        if fullname == alias or fullname.startswith(alias + "."):
            return real + fullname[len(alias):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, real_name):
        self.real_name = real_name
        self._spec = None

    def create_module(self, spec):
        if self.real_name is None:  # the bare `neuronxcc` parent: an empty package
            return None
        module = importlib.import_module(self.real_name)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        if self.real_name is None:
            module.__path__ = []
            return
        module.__spec__ = self._spec  # keep the real module's identity


def _is_alias(top):
    module = sys.modules.get(top)
    if module is None:
        return False
    if top == "nki":
        return module is sys.modules.get("torch_neuronx.nki")
    return isinstance(getattr(module, "__loader__", None), _AliasLoader)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in ("nki", "neuronxcc"):
            return None
        if fullname == top and self._provided_elsewhere(fullname):
            return None  # a real installation provides it: never shadow it
        if fullname != top and not _is_alias(top):
            return None  # the parent is a real package: let it import its own children
        if fullname in _NAMESPACE_PARENTS:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(None),
                                                  is_package=True)
        real = _target(fullname)
        if real is None:
            return None
        try:
            if importlib.util.find_spec(real) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=True)

    def _provided_elsewhere(self, fullname):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                if finder.find_spec(fullname, None) is not None:
                    return True
            except (ImportError, ValueError):
                continue
        return False


def install():
    """Register the alias finder once (idempotent). It is placed first so aliased
    submodules never load twice, and it defers to any real ``nki``/``neuronxcc``."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
