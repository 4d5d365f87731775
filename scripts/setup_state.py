"""What scripts/setup.sh still has to do in this environment, so that a second run on an
unchanged tree takes seconds.

    python scripts/setup_state.py installed   exit 0 if every pin of pyproject.toml (and what the
                                              pinned packages need) is installed at a matching
                                              version, and this checkout is the editable install
                                              made from the current pyproject.toml and setup.py
    python scripts/setup_state.py built       exit 0 if torch_neuronx/_C was built from the
                                              current csrc/ and setup.py, by this Python and torch
    python scripts/setup_state.py stamp KIND  record that `installed` or `built` now holds

Anything it cannot decide (no stamp, a package it cannot read) answers "not done", so
setup.sh falls back to the full install. Stamps live in build/, which git ignores.
Standard library only, plus the `packaging` that pip brings.
"""

import glob
import hashlib
import importlib.metadata as metadata
import json
import os
import sys
from urllib.parse import unquote, urlparse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMPS = os.path.join(ROOT, "build", "setup-stamps.json")
EXTRAS = ("hf", "test")
TOOLS = ("setuptools", "wheel", "ninja")  # setup.sh installs these before the package


def _digest(paths, *extra):
    h = hashlib.sha256()
    for part in extra:
        h.update(f"{part}\0".encode())
    for path in sorted(paths):
        h.update(os.path.relpath(path, ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _key(kind):
    # The interpreter is part of both keys: another venv has its own packages and needs its own build.
    if kind == "installed":
        return _digest([os.path.join(ROOT, "pyproject.toml"), os.path.join(ROOT, "setup.py")], sys.executable)
    csrc = [p for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*"), recursive=True) if os.path.isfile(p)]
    return _digest([*csrc, os.path.join(ROOT, "setup.py")], sys.executable, metadata.version("torch"))


def _read_stamps():
    try:
        with open(STAMPS) as f:
            stamps = json.load(f)
        return stamps if isinstance(stamps, dict) else {}
    except (OSError, ValueError):
        return {}


def _requirement_cls():
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def _pins():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    pins = list(project["dependencies"])
    for extra in EXTRAS:
        pins += project["optional-dependencies"][extra]
    return pins + list(TOOLS)


def _satisfied(requirements):
    """Every requirement installed at an allowed version, and (walking their metadata) what they need."""
    Requirement = _requirement_cls()
    todo = [(Requirement(r), ()) for r in requirements]
    seen = set()
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras or ("",)):
            continue
        key = (req.name.lower().replace("_", "-"), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            return False
        if not req.specifier.contains(dist.version, prereleases=True):
            return False
        todo += [(Requirement(r), tuple(req.extras)) for r in dist.requires or ()]
    return True


def _editable_here():
    try:
        dist = metadata.distribution("torch-neuronx")
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return False
    if not info.get("dir_info", {}).get("editable"):
        return False
    path = unquote(urlparse(info.get("url", "")).path)
    return os.path.realpath(path) == os.path.realpath(ROOT)


def _built():
    return bool(glob.glob(os.path.join(ROOT, "torch_neuronx", "_C*.so"))) and _read_stamps().get("built") == _key(
        "built"
    )


def main(argv):
    if argv[:1] == ["installed"]:
        ok = _read_stamps().get("installed") == _key("installed") and _editable_here() and _satisfied(_pins())
        return 0 if ok else 1
    if argv[:1] == ["built"]:
        return 0 if _built() else 1
    if len(argv) == 2 and argv[0] == "stamp" and argv[1] in ("installed", "built"):
        stamps = _read_stamps()
        stamps[argv[1]] = _key(argv[1])
        os.makedirs(os.path.dirname(STAMPS), exist_ok=True)
        tmp = f"{STAMPS}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(stamps, f)
        os.replace(tmp, STAMPS)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:  # undecidable: setup.sh does the full install
        print(f"setup_state: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
