"""torchvision beside the pinned CPU torch: our setup never installs one, and one that is
installed must be the release made for this torch (a mismatched one breaks the imports of
transformers and diffusers, which import torchvision whenever it is installed)."""

import importlib.metadata as md
import re
import subprocess
import sys

import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from helpers import REPO, worker_env

FIX = (
    "pip uninstall torchvision (nothing in torch-neuronx needs it), or install the one made for this torch: "
    "pip install torchvision=={want} --index-url https://download.pytorch.org/whl/cpu"
)


def _paired_torchvision(torch_version: str) -> str:
    """The torchvision release made for a torch 2.x release: 0.(x + 15), e.g. torch 2.13 <-> 0.28."""
    v = Version(torch_version)
    assert v.major == 2, f"the torch 2.x <-> torchvision 0.(x + 15) rule does not cover torch {torch_version}"
    return f"0.{v.minor + 15}.{v.micro}"


def _requires_closure(requirements: list[str]) -> set[str]:
    """Canonical names of `requirements` and, through installed metadata, everything they pull in."""
    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            deps = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # not installed here: its own requirements cannot be read
        for dep in map(Requirement, deps):
            # a dependency's optional extras are not installed by ours
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                todo.append(dep)
    return seen


def test_paired_torchvision_rule_matches_published_pairs():
    assert _paired_torchvision("2.13.0") == "0.28.0"  # torchvision 0.28.0 requires torch==2.13.0
    assert _paired_torchvision("2.5.1") == "0.20.1"
    assert _paired_torchvision("2.13.0+cpu") == "0.28.0"


def test_setup_never_requests_torchvision():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requested = list(project["dependencies"]) + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    assert "torchvision" not in {canonicalize_name(Requirement(r).name) for r in requested}
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert not re.search(r"torchvision", setup, re.IGNORECASE)
    # nor through a dependency (timm, for one, requires torchvision); checked where it is installed
    closure = _requires_closure(requested)
    assert "torchvision" not in closure, "a dependency of torch-neuronx (or of its extras) pulls in torchvision"


def test_requires_closure_follows_installed_metadata():
    pytest.importorskip("transformers")
    # transformers requires huggingface-hub, which requires filelock: two levels down
    assert {"transformers", "huggingface-hub", "filelock"} <= _requires_closure(["transformers"])


def test_installed_torchvision_is_the_one_made_for_this_torch():
    try:
        have = md.version("torchvision")  # metadata, not import: a mismatched one may fail to import
    except md.PackageNotFoundError:
        pytest.skip("torchvision is not installed (nothing in torch-neuronx needs it)")
    want = _paired_torchvision(torch.__version__)
    fix = FIX.format(want=want)
    assert (
        Version(have).release[:2] == Version(want).release[:2]
    ), f"torchvision {have} is installed beside torch {torch.__version__}, which pairs with torchvision {want}; {fix}"
    # The right version number can still be a build for another torch (PyPI's Linux wheels are CUDA builds,
    # whose operators do not load beside the CPU torch): its operators must load.
    p = subprocess.run(
        [sys.executable, "-c", "import torch, torchvision; torch.ops.torchvision.nms"],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        p.returncode == 0
    ), f"torchvision {have} does not load beside torch {torch.__version__}; {fix}\n{p.stderr[-2000:]}"
