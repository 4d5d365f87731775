"""scripts/setup_state.py: what a second scripts/setup.sh may skip, and what it must redo."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from helpers import REPO


def _copy(tmp_path):
    """A checkout with the files the stamps cover (pyproject.toml, setup.py, csrc/) and a built core."""
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup_state.py", tmp_path / "scripts")
    (tmp_path / "csrc" / "aten").mkdir(parents=True)
    (tmp_path / "csrc" / "aten" / "a.cpp").write_text("int a() { return 1; }\n")
    (tmp_path / "csrc" / "aten" / "a.h").write_text("int a();\n")
    (tmp_path / "torch_neuronx").mkdir()
    (tmp_path / "torch_neuronx" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    return tmp_path


def _state(root, *args):
    return subprocess.run([sys.executable, str(root / "scripts" / "setup_state.py"), *args], cwd=root).returncode


def test_core_is_rebuilt_only_when_csrc_or_setup_py_changed(tmp_path):
    root = _copy(tmp_path)
    assert _state(root, "built") == 1  # never built here: a fresh clone builds
    assert _state(root, "stamp", "built") == 0
    assert _state(root, "built") == 0  # unchanged: nothing to build
    (root / "csrc" / "aten" / "a.h").write_text("int a(int);\n")  # a header counts too
    assert _state(root, "built") == 1
    assert _state(root, "stamp", "built") == 0 and _state(root, "built") == 0
    (root / "csrc" / "aten" / "b.cpp").write_text("int b() { return 2; }\n")  # a new file
    assert _state(root, "built") == 1
    assert _state(root, "stamp", "built") == 0
    with open(root / "setup.py", "a") as f:
        f.write("\n# changed\n")
    assert _state(root, "built") == 1
    assert _state(root, "stamp", "built") == 0
    for so in (root / "torch_neuronx").glob("_C*.so"):
        so.unlink()
    assert _state(root, "built") == 1  # the stamp without the library: build


def test_install_is_redone_unless_this_checkout_is_the_editable_install(tmp_path):
    root = _copy(tmp_path)
    assert _state(root, "stamp", "installed") == 0
    # Stamped, but the installed torch-neuronx is not an editable install of this copy.
    assert _state(root, "installed") == 1
    assert _state(root, "nonsense") == 2


@pytest.fixture
def state():
    spec = importlib.util.spec_from_file_location("setup_state", REPO / "scripts" / "setup_state.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pins_are_checked_against_installed_versions(state):
    import torch

    pins = state._pins()
    assert "torch==2.13.*" in pins and "transformers==5.23.0" in pins and "ruff==0.8.6" in pins
    assert state._satisfied(pins)  # this environment was set up by scripts/setup.sh
    version = torch.__version__.split("+")[0]
    assert state._satisfied([f"torch=={version}"])
    assert not state._satisfied(["torch==2.12.0"])  # another version: install
    assert not state._satisfied(["torch-neuronx-no-such-package"])  # missing: install
    assert not state._satisfied(["transformers==5.23.0", "no-such-dependency-of-a-pin"])
