"""Example scripts' command lines under torchrun: usage and errors printed by rank 0 only."""

import subprocess
import sys

import pytest

from helpers import REPO, worker_env

GENERATE = [sys.executable, str(REPO / "examples" / "generate.py"), "--max-new-tokens", "0"]
SFT = [sys.executable, str(REPO / "examples" / "sft.py"), "--tp_size", "2", "--output_dir", "unused"]


# (rank 0 of sft.py: tests/hf/test_sft.py::test_sft_example_rejects_a_mesh_that_does_not_match_the_processes)
@pytest.mark.parametrize(
    "cmd,error,rank",
    [
        (GENERATE, "--max-new-tokens must be >= 1", "0"),
        (GENERATE, "--max-new-tokens must be >= 1", "1"),
        (SFT, "must equal the number of processes (1)", "1"),
    ],
    ids=["generate-rank0", "generate-rank1", "sft-rank1"],
)
def test_bad_arguments_reported_once_by_rank_zero(tmp_path, cmd, error, rank):
    p = subprocess.run(
        cmd, cwd=tmp_path, env=worker_env(RANK=rank, WORLD_SIZE="1"), capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2, p.stderr[-3000:]
    if rank == "0":
        assert "usage:" in p.stderr and error in p.stderr, p.stderr[-3000:]
    else:
        assert "usage:" not in p.stderr and error not in p.stderr, p.stderr[-3000:]
