"""Command-line tools in pipes and their --help: no traceback when the reader leaves early."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import worker_env

ROOT = Path(__file__).resolve().parents[2]
LS = [sys.executable, "-m", "torch_neuronx.tools.neuron_ls"]
CLI = [sys.executable, "-m", "torch_neuronx.cli"]


def _env():
    return {k: v for k, v in worker_env().items() if not k.startswith("NEURON_RT_")}


def _run_into_closed_pipe(cmd):
    """Run `cmd` with stdout a pipe whose reader is already gone (what `| head -1` becomes)."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(cmd, stdout=w, stderr=subprocess.PIPE, text=True, env=_env(), timeout=120)
    finally:
        os.close(w)
    return proc


@pytest.mark.parametrize("args", [[], ["--help"]], ids=["table", "help"])
def test_neuron_ls_into_closed_pipe_exits_quietly(args):
    proc = _run_into_closed_pipe([*LS, *args])
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_torch_neuronx_ls_into_closed_pipe_exits_quietly():
    proc = _run_into_closed_pipe([*CLI, "ls"])
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_neuron_ls_piped_to_head_in_a_shell():
    cmd = f"set -o pipefail; {sys.executable} -m torch_neuronx.tools.neuron_ls | head -1"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("instance-type: ") and proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "cmd,usage",
    [(LS, "usage: neuron-ls"), ([*CLI, "ls"], "usage: torch-neuronx ls")],
    ids=["neuron-ls", "torch-neuronx-ls"],
)
def test_ls_help_names_the_command_used(cmd, usage):
    proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(usage), proc.stdout


@pytest.mark.parametrize("script", ["add.py", "softmax.py"])
def test_nki_tutorial_help_does_not_run_the_kernel(script):
    path = ROOT / "examples" / "nki" / script
    proc = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ") and "{trn2,trn3}" in proc.stdout, proc.stdout
    assert "matches PyTorch" not in proc.stdout


def test_nki_tutorial_rejects_an_unknown_target_before_running():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "nki" / "add.py"), "trn9"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and "invalid choice: 'trn9'" in proc.stderr, proc.stderr
    assert "matches PyTorch" not in proc.stdout
