"""Every environment variable has one home: neuronsim/settings.py, and docs/configuration.md."""

import ast
import re
from pathlib import Path

import pytest

from neuronsim import hardware as _hardware
from neuronsim import settings as _settings

ROOT = Path(__file__).resolve().parents[2]
# Both packages of the distribution: torch_neuronx and the torch-free neuronsim (NKI, hardware table).
PACKAGES = (ROOT / "torch_neuronx", ROOT / "neuronsim")
CSRC = ROOT / "csrc"
DOCS = ROOT / "docs"
REGISTRY = ROOT / "neuronsim" / "settings.py"
_ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
_ACCESSORS = {"get", "raw", "setdefault", "override"}


def _package_files():
    return sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def _env_uses(path: Path):
    """(line, text) of each touch of the process environment through the os module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    os_aliases = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_aliases |= {a.asname or a.name for a in node.names if a.name == "os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in _ENV_NAMES:
                    yield node.lineno, f"from os import {a.name}"
        elif isinstance(node, ast.Attribute) and node.attr in _ENV_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id in os_aliases:
                yield node.lineno, f"{node.value.id}.{node.attr}"


def _registry_calls():
    """(path, line, name) of each _settings.<accessor>("NAME") call with a literal name."""
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "_settings"
                and node.func.attr in _ACCESSORS
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                yield path, node.lineno, node.args[0].value


def _cpp_getenv_names():
    """{name: [files]} read with getenv in csrc/, through a local wrapper such as env("NAME") too."""
    found: dict[str, list[str]] = {}
    for path in sorted(CSRC.rglob("*")):
        if path.suffix not in (".h", ".cpp") or "tests" in path.relative_to(CSRC).parts:
            continue
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        for m in re.finditer(r"\bgetenv\s*\(\s*([^)]*?)\s*\)", text):
            arg = m.group(1)
            lit = re.fullmatch(r'"([A-Za-z0-9_]+)"', arg)
            if lit:
                found.setdefault(lit.group(1), []).append(rel)
                continue
            # getenv(name) inside a wrapper: the names are the literals the wrapper is called with.
            heads = re.findall(r"\b(\w+)\s*\([^()]*\bconst char\s*\*\s*" + re.escape(arg) + r"\b", text[: m.start()])
            assert heads, f"{rel}: getenv({arg}) reads a name this test cannot see; pass a string literal"
            for name in re.findall(r"\b" + heads[-1] + r'\s*\(\s*"([A-Za-z0-9_]+)"', text):
                found.setdefault(name, []).append(rel)
    return found


def test_python_reads_the_environment_only_through_the_registry():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _package_files()
        if path != REGISTRY
        for line, what in _env_uses(path)
    ]
    assert offenders == [], "read environment variables with neuronsim.settings.get/raw (declare them there)"


def test_the_scan_sees_environment_reads(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os as o\nfrom os import getenv\nx = o.environ.get('A')\ny = getenv('B')\n")
    assert sorted(what for _, what in _env_uses(sample)) == ["from os import getenv", "o.environ"]


def test_every_name_python_passes_to_the_registry_is_registered():
    unknown = [
        f"{p.relative_to(ROOT)}:{line}: {name}" for p, line, name in _registry_calls() if name not in _settings.SETTINGS
    ]
    assert unknown == []


def test_cpp_reads_only_registered_names():
    names = _cpp_getenv_names()
    assert "TORCH_NEURONX_STRICT_FALLBACK" in names and "NEURON_RT_NUM_CORES" in names  # the scan works
    unregistered = {n: files for n, files in names.items() if n not in _settings.SETTINGS}
    assert unregistered == {}, "declare these in neuronsim/settings.py with read_by including 'c++'"
    unmarked = sorted(n for n in names if "c++" not in _settings.SETTINGS[n].read_by)
    assert unmarked == [], "mark these read_by=(..., 'c++') in neuronsim/settings.py"


def test_registry_marks_cpp_only_where_cpp_reads():
    names = _cpp_getenv_names()
    stale = sorted(n for n, s in _settings.SETTINGS.items() if "c++" in s.read_by and n not in names)
    assert stale == [], "csrc/ no longer reads these: drop 'c++' from their read_by"


def test_registry_marks_python_only_where_python_names_them():
    # A variable read by Python appears by name in some package file other than the registry.
    text = "\n".join(p.read_text() for p in _package_files() if p != REGISTRY)
    stale = sorted(n for n, s in _settings.SETTINGS.items() if "python" in s.read_by and f'"{n}"' not in text)
    assert stale == [], "no Python code reads these: drop 'python' from their read_by"


@pytest.mark.parametrize("setting", list(_settings.SETTINGS.values()), ids=lambda s: s.name)
def test_every_setting_is_declared_fully_and_documented(setting):
    assert setting.group in _settings.GROUPS
    assert setting.type in (bool, int, str)
    assert setting.default is None or isinstance(setting.default, setting.type)
    assert set(setting.read_by) <= {"python", "c++"} and setting.read_by
    assert setting.meaning
    configuration = (DOCS / "configuration.md").read_text()
    assert f"`{setting.name}`" in configuration, f"document {setting.name} in docs/configuration.md"
    page = (DOCS / setting.doc).read_text()
    assert re.search(f"`{setting.name}[`=]", page), f"document {setting.name} in docs/{setting.doc}"


def test_configuration_md_lists_no_unregistered_variable():
    configuration = (DOCS / "configuration.md").read_text()
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", configuration, flags=re.M)
    assert sorted(set(rows) - set(_settings.SETTINGS)) == []


def test_defaults_agree_with_the_hardware_table():
    assert _settings.SETTINGS["TORCH_NEURONX_INSTANCE_TYPE"].default == _hardware.DEFAULT_INSTANCE


def test_get_reads_at_call_time_with_the_declared_type(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    assert _settings.get("TORCH_NEURONX_NEFF_DISABLE_CACHE") is False
    assert _settings.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION") is True
    assert _settings.get("WORLD_SIZE") == 1
    assert _settings.get("TORCH_NEURONX_DEBUG_DIR") == "neuron_compile_artifacts"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", " On ")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", "")
    assert _settings.get("TORCH_NEURONX_NEFF_DISABLE_CACHE") is True
    assert _settings.get("WORLD_SIZE") == 4
    assert _settings.get("TORCH_NEURONX_DEBUG_DIR") == "neuron_compile_artifacts"  # empty counts as unset
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE='four' is not an integer"):
        _settings.get("WORLD_SIZE")


def test_unregistered_names_are_refused():
    with pytest.raises(KeyError, match="declare it in neuronsim/settings.py"):
        _settings.get("TORCH_NEURONX_NO_SUCH_VARIABLE")


def test_override_restores(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with _settings.override("TORCHINDUCTOR_CACHE_DIR", "/tmp/x"):
        assert _settings.raw("TORCHINDUCTOR_CACHE_DIR") == "/tmp/x"
    assert _settings.raw("TORCHINDUCTOR_CACHE_DIR") is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/y")
    with _settings.override("TORCHINDUCTOR_CACHE_DIR", "/tmp/x"):
        pass
    assert _settings.raw("TORCHINDUCTOR_CACHE_DIR") == "/tmp/y"
