"""One rank: a process becoming a rank of a job, and running the user's script under a recording.

``python -m torch_neuronx.readiness.launch.rank --job DIR/job.json``: what ``torch-neuronx check``
starts, directly or through torchrun (each rank of a dry run of several ranks is forked by the
``scheduler`` instead, which calls :func:`run`). The script (``script.py``, ``-m module``, or
``--entry module:attr name``: a console script's entry point, called the way its generated wrapper
calls it, with ``sys.argv[0]`` the script's name and its result the exit status) runs under a
session; the recording goes to DIR/rank<RANK>.json; the script's exit status is this process's.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from .job import Job


def rank_env(rank: int, nproc: int, world: int, port: int) -> dict:
    """The environment torchrun gives rank `rank` of a job of `world` ranks, `nproc` per node,
    joining the job's store on this machine's `port`."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % nproc),
        "GROUP_RANK": str(rank // nproc),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        # The ranks join this process's store as torchrun's workers join its agent's, so no
        # rank has to host it (they start at different times).
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": "dry-run",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


class AsRank:
    """This process as rank `rank` of a job of `world` ranks, for a dry run in process: the
    rank's torchrun environment (``init_process_group("neuron")`` then gives the real rank
    and world size, so DeviceMesh coordinates are the real ones) and the job's store hosted
    here. Nothing waits for the other ranks, which are not run. On exit the process group
    made inside (a fake one) is destroyed and the environment restored."""

    def __init__(self, rank: int, world: int, nproc_per_node: int | None = None):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a job of world size {world} (ranks 0-{world - 1})")
        self.rank, self.world, self.nproc = rank, world, nproc_per_node
        self._store = None
        self._prev = None

    def __enter__(self) -> "AsRank":
        import torch
        import torch.distributed as dist

        from neuronsim import settings as _settings

        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process; dry-run as another rank before it")
        nproc = self.nproc or min(self.world, torch.neuron.device_count())
        self._store = dist.TCPStore("127.0.0.1", 0, self.world, is_master=True, wait_for_workers=False)
        self._prev = _settings.set_rank_environment(rank_env(self.rank, nproc, self.world, self._store.port))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        from neuronsim import settings as _settings

        if dist.is_initialized():
            dist.destroy_process_group()  # a fake group: no real run may use it
        _settings.set_rank_environment(self._prev)
        self._store = None


def _runner(target: list[str]):
    """What runs the target (sys.argv set as its own launcher sets it)."""
    if target[0] == "--entry":
        from importlib.metadata import EntryPoint

        entry = EntryPoint(target[2], target[1], "console_scripts")
        sys.argv = target[2:]
        return lambda: sys.exit(entry.load()())
    if target[0] == "-m":
        sys.argv = [target[1]] + target[2:]
        return lambda: runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    sys.argv = list(target)
    sys.path[0] = os.path.dirname(os.path.abspath(target[0]))  # as `python script.py` does
    return lambda: runpy.run_path(target[0], run_name="__main__")


def _session(job: Job):
    from ..record.session import Session

    if job.dry_run:
        from ..dry.executor import DryExecutor

        return Session(DryExecutor())
    from ..record.real import RealExecutor

    return Session(RealExecutor())


def run(job: Job) -> int:
    """Runs the job's script as this process's rank, under a recording; returns its exit status."""
    run_target = _runner(job.target)
    session = _session(job)
    session.start()
    rc, error, exit_code = 0, None, None
    try:
        run_target()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        exit_code = e.code
    except BaseException as e:  # the report says how the script ended
        error, rc = e, 1
    finally:
        recording = session.stop(error)
        if error is not None:
            traceback.print_exception(error)
        elif rc:
            recording.error = f"SystemExit: {exit_code}"
        recording.absent_weights = list(job.absent_weights)
        path = os.path.join(job.raw_dir, f"rank{recording.rank}.json")
        with open(path + ".tmp", "w") as f:
            f.write(recording.to_json())
        os.replace(path + ".tmp", path)
    return rc


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--job":
        print("usage: python -m torch_neuronx.readiness.launch.rank --job DIR/job.json", file=sys.stderr)
        return 2
    return run(Job.load(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
