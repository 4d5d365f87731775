"""The PyTorch-free runtime's own C++ tests (csrc/runtime/tests), compiled with g++ and run."""

import shutil
import subprocess
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

CSRC = Path(__file__).resolve().parents[2] / "csrc"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_runtime_cpp(tmp_path):
    exe = tmp_path / "runtime_tests"
    sources = sorted(str(p) for p in (CSRC / "runtime").glob("*.cpp"))
    sources.append(str(CSRC / "runtime" / "tests" / "runtime_tests.cpp"))
    # include_paths(): only for the header-only c10/util/flat_hash_map.h; nothing links against torch.
    cmd = ["g++", "-std=c++20", "-O0", f"-I{CSRC}", *(f"-I{p}" for p in include_paths()), *sources, "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    env = {"PATH": "/usr/bin:/bin"}  # no Neuron variables from the caller: the program sets its own
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "runtime tests passed" in run.stdout
