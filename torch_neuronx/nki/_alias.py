"""Make ``import nki`` / ``import neuronxcc.nki`` resolve to :mod:`torch_neuronx.nki`.

The finder answers only when no other finder provides the top-level name, so a real
AWS ``nki`` / ``neuronx-cc`` installation always wins. Aliased names map to the same
module objects (no second copy of the language state).

The NKI simulator needs only NumPy, and ``torch_neuronx/__init__.py`` imports torch, so
when ``torch_neuronx`` is not imported yet the aliased package is loaded from its file
under its real name without its parent. The finder is installed by ``import torch``
(torch_neuronx's autoload) and, for interpreters that never import torch, by the
``torch_neuronx_nki.pth`` start-up file that :func:`write_pth` creates (setup does).
This module imports nothing from torch_neuronx, so the ``.pth`` can load it by path.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import types

_NKI_DIR = os.path.dirname(os.path.abspath(__file__))

_ALIASES = {"nki": "torch_neuronx.nki", "neuronxcc.nki": "torch_neuronx.nki"}
_NAMESPACE_PARENTS = {"neuronxcc"}


def _target(fullname):
    for alias, real in _ALIASES.items():
        if fullname == alias or fullname.startswith(alias + "."):
            return real + fullname[len(alias) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, real_name):
        self.real_name = real_name
        self._spec = None

    def create_module(self, spec):
        if self.real_name is None:  # the bare `neuronxcc` parent: an empty package
            return None
        module = _import_real(self.real_name)
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
    return type(getattr(module, "__loader__", None)).__name__ == "_AliasLoader"


class _AliasFinder(importlib.abc.MetaPathFinder):
    _torch_neuronx_nki_alias = True

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if (
            top == "torch_neuronx"
            and fullname.startswith("torch_neuronx.nki.")
            and "torch_neuronx" not in sys.modules
            and "torch_neuronx.nki" in sys.modules
        ):
            # Submodules of the parent-less nki package: find them by its path, before
            # other finders try to import the (torch-importing) parent.
            return importlib.machinery.PathFinder.find_spec(fullname, sys.modules["torch_neuronx.nki"].__path__)
        if top not in ("nki", "neuronxcc"):
            return None
        if fullname == top and self._provided_elsewhere(fullname):
            return None  # a real installation provides it: never shadow it
        if fullname != top and not _is_alias(top):
            return None  # the parent is a real package: let it import its own children
        if fullname in _NAMESPACE_PARENTS:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(None), is_package=True)
        real = _target(fullname)
        if real is None or not _real_exists(real):
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


def _real_exists(real):
    """Whether ``torch_neuronx.nki[.sub]`` exists, without importing torch_neuronx."""
    rel = real.split(".")[2:]
    base = os.path.join(_NKI_DIR, *rel)
    return os.path.isdir(base) or os.path.isfile(base + ".py")


# The NumPy-only modules of the simulator: all a NumPy kernel needs.
_TORCH_FREE = (
    "_errors",
    "_dtypes",
    "_math",
    "_hwtable",
    "_rules",
    "_cost_model",
    "_memory",
    "_context",
    "_tensor",
    "_ops",
    "_simulator",
    "_jit",
    "language",
    "isa",
    "typing",
    "compiler",
)


def _import_real(real):
    """Import ``torch_neuronx.nki[.sub]``. Without torch_neuronx loaded, load the nki
    package and its NumPy-only modules from their files so that torch (imported by
    torch_neuronx/__init__) is not: ``from . import x`` inside a package makes CPython
    import the top-level package, so a bare placeholder stands in for torch_neuronx
    while they load, and is removed afterwards (a later ``import torch_neuronx`` runs
    the real package)."""
    if "torch_neuronx" not in sys.modules and "torch_neuronx.nki" not in sys.modules:
        placeholder = types.ModuleType("torch_neuronx")
        placeholder.__path__ = [os.path.dirname(_NKI_DIR)]
        sys.modules["torch_neuronx"] = placeholder
        try:
            spec = importlib.util.spec_from_file_location(
                "torch_neuronx.nki", os.path.join(_NKI_DIR, "__init__.py"), submodule_search_locations=[_NKI_DIR]
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules["torch_neuronx.nki"] = module
            spec.loader.exec_module(module)
            for name in _TORCH_FREE:
                importlib.import_module(f"torch_neuronx.nki.{name}")
        except BaseException:
            for name in [m for m in sys.modules if m.startswith("torch_neuronx.nki")]:
                del sys.modules[name]
            raise
        finally:
            if sys.modules.get("torch_neuronx") is placeholder:
                del sys.modules["torch_neuronx"]
    return importlib.import_module(real)


def install():
    """Register the alias finder once (idempotent). It is placed first so aliased
    submodules never load twice, and it defers to any real ``nki``/``neuronxcc``."""
    if not any(getattr(f, "_torch_neuronx_nki_alias", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    # A torch-free `import nki` may have loaded these before their parent package:
    # make them attributes of torch_neuronx once it exists, as a normal import would.
    parent = sys.modules.get("torch_neuronx")
    if parent is not None:
        for name in ("nki", "_hardware"):
            mod = sys.modules.get(f"torch_neuronx.{name}")
            if mod is not None and name not in vars(parent):
                setattr(parent, name, mod)


def pth_line():
    """The start-up line that installs the finder in every interpreter (no torch).

    It does nothing once the checkout it points to is gone, so a moved or deleted
    source tree never breaks the interpreter's start-up."""
    path = os.path.abspath(__file__)
    body = (
        f"if os.path.exists({path!r}):\n"
        "    import importlib.util as u\n"
        f"    s = u.spec_from_file_location('_torch_neuronx_nki_alias', {path!r})\n"
        "    m = u.module_from_spec(s); s.loader.exec_module(m); m.install()\n"
    )
    return f"import os; exec({body!r})\n"


def write_pth(site_dir=None):
    """Write ``torch_neuronx_nki.pth`` into ``site_dir`` (default: purelib site-packages)."""
    site_dir = site_dir or sysconfig.get_paths()["purelib"]
    path = os.path.join(site_dir, "torch_neuronx_nki.pth")
    with open(path, "w") as f:
        f.write(pth_line())
    return path
