"""Make ``import nki`` / ``import neuronxcc.nki`` (and ``torch_neuronx.nki``) resolve to
:mod:`neuronsim.nki`.

The finder answers ``nki`` and ``neuronxcc`` only when no other finder provides the
top-level name, so a real AWS ``nki`` / ``neuronx-cc`` installation always wins. Aliased
names map to the same module objects as ``neuronsim.nki`` (no second copy of the
language state). The distribution installs a start-up file, ``neuronsim-nki.pth``, that
calls :func:`install` in every interpreter; ``import torch_neuronx`` calls it too.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_REAL = "neuronsim.nki"
_ALIASES = ("nki", "neuronxcc.nki", "torch_neuronx.nki")
_SHADOWABLE = ("nki", "neuronxcc")  # top-level names a real AWS installation may own
_NAMESPACE_PARENTS = {"neuronxcc"}  # an empty package holding the aliased child
# Set on finders of this kind; older releases' finders carry the second name (see install).
_MARK = "_neuronsim_nki_alias"
_LEGACY_MARK = "_torch_neuronx_nki_alias"


def _target(fullname):
    for alias in _ALIASES:
        if fullname == alias or fullname.startswith(alias + "."):
            return _REAL + fullname[len(alias) :]
    return None


class _NkiAliasLoader(importlib.abc.Loader):
    # Not named _AliasLoader: an older release's finder, which a stale start-up file may still
    # install after ours, takes modules with a loader of that name for its own aliases.
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
    """Whether the already-imported top-level ``top`` (nki / neuronxcc) is our alias."""
    module = sys.modules.get(top)
    if module is None:
        return False
    if top == "nki":
        return module is sys.modules.get(_REAL)
    return isinstance(getattr(module, "__loader__", None), _NkiAliasLoader)


class _AliasFinder(importlib.abc.MetaPathFinder):
    _neuronsim_nki_alias = True  # _MARK

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in _SHADOWABLE:
            pass  # torch_neuronx.nki[.sub] is ours alone; other names are not aliases
        elif fullname == top and self._provided_elsewhere(fullname):
            return None  # a real installation provides it: never shadow it
        elif fullname != top and not _is_alias(top):
            return None  # the parent is a real package: let it import its own children
        if fullname in _NAMESPACE_PARENTS:
            return importlib.machinery.ModuleSpec(fullname, _NkiAliasLoader(None), is_package=True)
        real = _target(fullname)
        if real is None or importlib.util.find_spec(real) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _NkiAliasLoader(real), is_package=True)

    def _provided_elsewhere(self, fullname):
        for finder in sys.meta_path:
            if finder is self or getattr(finder, _LEGACY_MARK, False) or not hasattr(finder, "find_spec"):
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
    # A start-up file left by an older release (torch_neuronx_nki.pth) installs a finder
    # that aliases a torch_neuronx.nki that no longer exists: this one replaces it.
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _LEGACY_MARK, False)]
    if not any(getattr(f, _MARK, False) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
