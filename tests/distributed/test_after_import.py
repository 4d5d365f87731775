"""torch_neuronx.distributed._after_import: what DTensor's SDPA sharding and context
parallelism use to patch PyTorch modules only once they are imported."""

import importlib
import sys

import pytest

from torch_neuronx.distributed._after_import import _finder, after_import


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write a module into a fresh directory on sys.path; forget it afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)
        _finder.pending.pop(name, None)
    if not _finder.pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def test_action_runs_once_right_after_the_first_import(modules):
    modules("nx_after_a", "X = 1\n")
    seen = []

    def act(module):
        seen.append(module.X)

    after_import("nx_after_a", act, "feature a")
    after_import("nx_after_a", act, "feature a")  # hooks installed twice act once
    assert seen == [] and "nx_after_a" not in sys.modules
    import nx_after_a

    assert seen == [1] and "nx_after_a" not in _finder.pending
    assert nx_after_a.__spec__.loader.get_source("nx_after_a") == "X = 1\n"  # its own loader
    after_import("nx_after_a", lambda m: seen.append("now"), "feature a, late")
    assert seen[-1] == "now"  # already imported: runs at once


def test_action_missing_from_this_torch_warns_and_the_import_succeeds(modules):
    modules("nx_after_b", "X = 2\n")

    def patch(module):
        raise AttributeError("module 'nx_after_b' has no attribute 'private_table'")

    after_import("nx_after_b", patch, "feature b")
    with pytest.warns(UserWarning, match=r"^torch-neuronx: feature b is not available with this torch .*private_table"):
        import nx_after_b
    assert nx_after_b.X == 2


def test_a_failed_import_keeps_its_action_for_the_retry(modules):
    modules("nx_after_c", "raise ImportError('not yet')\n")
    seen = []
    after_import("nx_after_c", lambda m: seen.append(m.X), "feature c")
    with pytest.raises(ImportError, match="not yet"):
        import nx_after_c  # noqa: F401
    assert seen == []
    modules("nx_after_c", "X = 3  # fixed\n")
    import nx_after_c  # noqa: F401,F811

    assert seen == [3]
