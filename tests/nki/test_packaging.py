"""The distribution ships the `import nki` start-up file itself, in wheels and in editable
installs (no setup script writes it), and with it `import nki` works without torch.

The builds run setup.py's own commands without the C++ extension (build_py for the wheel's
contents, editable_wheel for `pip install -e`); the start-up file is then processed exactly
as site-packages' .pth files are (``site.addsitedir``) in a fresh interpreter.
"""

import os
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")  # classes and constants, no build
PTH_NAME, PTH_LINE = SETUP["PTH_NAME"], SETUP["PTH_LINE"]

# A NumPy-only NKI tutorial, as a user without torch writes it.
_KERNEL_SCRIPT = """
import site, sys
site.addsitedir(sys.argv[1])  # what start-up does with site-packages: runs its .pth files
sys.path += sys.argv[2:]  # NumPy, without this interpreter's own .pth files
import neuronsim
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import nki as nki2
import nki.isa as nisa
import numpy as np
assert nki2 is nki and nl is nki.language and nisa is nki.isa and nki.__name__ == "neuronsim.nki"

@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out

x = np.arange(12, dtype=np.float32).reshape(3, 4)
assert (add(x, x) == 2 * x).all()
assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "torch_neuronx")], "NumPy-only NKI imported torch"
print(neuronsim.__file__)
"""


def _env():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the build under test
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def _run(args, cwd, timeout=180):
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _import_nki_from(site_dir, cwd):
    """Run the NumPy kernel in an interpreter whose only site directory is ``site_dir``
    (``-S``: this machine's site-packages may hold another install of the distribution);
    returns neuronsim's file."""
    deps = sorted({str(Path(m.__file__).parents[1]) for m in (np, ml_dtypes)})
    out = _run(["-S", "-c", _KERNEL_SCRIPT, str(site_dir), *deps], cwd=cwd)
    return Path(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wheel_root(tmp_path_factory):
    """What a wheel installs into site-packages: build_py's output (the wheel's root)."""
    tmp = tmp_path_factory.mktemp("wheel")
    lib = tmp / "lib"
    _run(["setup.py", "-q", "egg_info", "--egg-base", str(tmp), "build_py", "--build-lib", str(lib)], cwd=ROOT)
    return lib


@pytest.fixture(scope="module")
def editable_wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("editable")
    script = (
        "import runpy, sys\n"
        "from setuptools import setup\n"
        "cmds = runpy.run_path('setup.py', run_name='setup')['CMDCLASS']\n"
        "setup(cmdclass=cmds, script_args=['-q', 'editable_wheel', '--dist-dir', sys.argv[1]])\n"
    )
    _run(["-c", script, str(tmp)], cwd=ROOT)
    (wheel,) = tmp.glob("*.whl")
    return wheel


def test_wheel_root_has_the_startup_file_and_both_packages(wheel_root):
    assert (wheel_root / PTH_NAME).read_text() == PTH_LINE
    assert (wheel_root / "neuronsim" / "nki" / "language.py").is_file()
    assert (wheel_root / "neuronsim" / "hardware.py").is_file()
    assert (wheel_root / "torch_neuronx" / "_nki" / "op.py").is_file()
    assert not (wheel_root / "torch_neuronx" / "nki").exists()  # one home: neuronsim/nki


def test_installed_wheel_gives_import_nki_without_torch(wheel_root, tmp_path):
    assert _import_nki_from(wheel_root, cwd=tmp_path).is_relative_to(wheel_root)


def test_editable_wheel_carries_the_startup_file(editable_wheel):
    with zipfile.ZipFile(editable_wheel) as z:
        assert z.read(PTH_NAME).decode() == PTH_LINE
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        assert any(line.startswith(PTH_NAME + ",sha256=") for line in z.read(record).decode().splitlines())


def test_editable_install_gives_import_nki_without_torch(editable_wheel, tmp_path):
    site_dir = tmp_path / "site-packages"
    with zipfile.ZipFile(editable_wheel) as z:
        z.extractall(site_dir)
    # The editable install's own path hook runs first (.pth files are read in name order) and
    # maps neuronsim to this checkout.
    assert sorted(p.name for p in site_dir.glob("*.pth"))[-1] == PTH_NAME
    assert _import_nki_from(site_dir, cwd=tmp_path).is_relative_to(ROOT / "neuronsim")


def test_startup_file_does_nothing_without_neuronsim(tmp_path):
    (tmp_path / PTH_NAME).write_text(PTH_LINE)
    code = "import site, sys; site.addsitedir(sys.argv[1]); import importlib.util as u; print(u.find_spec('nki'))"
    r = subprocess.run(
        [sys.executable, "-S", "-c", code, str(tmp_path)], cwd=tmp_path, env=_env(), capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stderr == "" and r.stdout.strip() == "None", r.stderr
