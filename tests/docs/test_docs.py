"""The documentation runs as written.

Every ```python block of README.md and docs/*.md runs in a fresh interpreter (its own
temporary working directory, in which `examples` points at the repository's examples;
HF_HUB_OFFLINE=1; a timeout). A comment on the line right before a fence controls it:

    <!-- fragment -->     a python block that is not meant to run on its own: skipped
    <!-- run -->          a shell block (bash) that runs, with `set -euo pipefail`
    <!-- slow -->         also marks the block's test `slow` (combine: <!-- run slow -->)

Shell blocks without `run` are not executed (installers, long jobs, hardware-sized runs).
Blocks that start several processes (torchrun, accelerate launch with --multi_gpu,
torch.multiprocessing) are marked `multiprocess`. The other tests check what every page
must satisfy: the guides exist, relative links and their anchors resolve, and no page
cites internal issue numbers or documents that are not in the repository.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO, worker_env

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GUIDES = [
    "README.md",
    "device.md",
    "configuration.md",
    "compile.md",
    "distributed.md",
    "huggingface.md",
    "diffusers.md",
    "nki.md",
    "tools.md",
    "fidelity.md",
    "architecture.md",
    "benchmarks.md",
    "readiness.md",
    "profiling.md",
]
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*([\w\s,]+?)\s*-->\s*$")
MARKER_WORDS = {"fragment", "run", "slow"}
PYTHON, SHELL = {"python", "py"}, {"bash", "sh", "shell"}
MULTIPROCESS = re.compile(r"torchrun|--multi_gpu|torch\.multiprocessing|mp\.spawn")
TIMEOUT, SLOW_TIMEOUT = 600, 1200


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    markers: frozenset
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the markers right before each fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        marker = MARKER.match(lines[i - 1]) if i else None
        words = frozenset(re.split(r"[\s,]+", marker.group(1))) if marker else frozenset()
        i += 1
        body = []
        while i < len(lines) and not (lines[i].startswith(fence[0] * len(fence)) and not lines[i].strip(fence[0])):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: code block is never closed")
        blocks.append(Block(page, start + 1, lang, words, "\n".join(body) + "\n"))
        i += 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in parse_blocks(page)]


def _runnable():
    params = []
    for b in ALL_BLOCKS:
        runs = (b.lang in PYTHON and "fragment" not in b.markers) or (b.lang in SHELL and "run" in b.markers)
        if not runs:
            continue
        marks = []
        if "slow" in b.markers:
            marks.append(pytest.mark.slow)
        if MULTIPROCESS.search(b.code):
            marks.append(pytest.mark.multiprocess)
        params.append(pytest.param(b, id=b.id, marks=marks))
    return params


@pytest.mark.parametrize("block", _runnable())
def test_code_block_runs(block, tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    env = worker_env()
    # console scripts (neuron-ls, torch-neuronx, torchrun, accelerate) of this interpreter first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if block.lang in PYTHON:
        script = tmp_path / "block.py"
        script.write_text(block.code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        script = tmp_path / "block.sh"
        script.write_text("set -euo pipefail\n" + block.code, encoding="utf-8")
        cmd = ["bash", str(script)]
    timeout = SLOW_TIMEOUT if "slow" in block.markers else TIMEOUT
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (
        f"{block.id} ({block.lang}) exited {p.returncode}\n--- code ---\n{block.code}"
        f"--- stdout ---\n{p.stdout[-4000:]}\n--- stderr ---\n{p.stderr[-6000:]}"
    )


def test_markers_are_known_and_placed_on_blocks_they_affect():
    for b in ALL_BLOCKS:
        unknown = b.markers - MARKER_WORDS
        assert not unknown, f"{b.id}: unknown marker word(s) {sorted(unknown)}; use {sorted(MARKER_WORDS)}"
        if "fragment" in b.markers:
            assert b.lang in PYTHON, f"{b.id}: <!-- fragment --> only applies to python blocks"
            assert not b.markers & {"run", "slow"}, f"{b.id}: a fragment does not run"
        if "run" in b.markers:
            assert b.lang in SHELL, f"{b.id}: <!-- run --> only applies to bash blocks (python blocks always run)"
        if "slow" in b.markers:
            assert b.lang in PYTHON or "run" in b.markers, f"{b.id}: <!-- slow --> on a block that does not run"


def test_every_guide_exists_and_the_readme_starts_with_its_title():
    missing = [g for g in GUIDES if not (REPO / "docs" / g).is_file()]
    assert not missing, f"docs/ is missing {missing}"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    first = (REPO / "README.md").read_text(encoding="utf-8").splitlines()[0]
    assert first == "# torch-neuronx", f"README.md must start with its title, not {first!r}"


def test_the_readme_names_the_test_command_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "`bash scripts/test.sh`" in readme and "`bash scripts/demo.sh`" in readme
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_references(page):
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"\bissue\s*#\s*\d", text, re.I), f"{page.name} cites an internal issue number"
    for internal in (
        "TORCHNEURON.md",
        "HF_CONTRACT.md",
        "PRIVATEUSE1_NOTES",
        "UPSTREAM_SUITES",
        "TRAINIUM_PERF",
        "/work/",
    ):
        assert internal not in text, f"{page.name} cites {internal!r}, which is not in the repository"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, -N for repeats."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code such as `kernel[grid](...)`
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path == "../CONTRIBUTING.md" or path == "CONTRIBUTING.md":
            continue  # written separately; may land after this page
        assert dest.exists(), f"{page.name}: link to {target!r}: {dest} does not exist"
        if anchor:
            assert anchor in _anchors(dest), f"{page.name}: link to {target!r}: no heading with anchor {anchor!r}"
