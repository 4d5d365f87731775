"""A dry run of a torchrun job: every rank, without a Python interpreter's imports per rank.

``python -m torch_neuronx.readiness._ranks --raw DIR --nnodes N --nproc-per-node P
[--workers W] [--ranks SPEC] (script.py | -m module) [args]``: what ``torch-neuronx check
--dry-run`` starts for ``torchrun``. With ``--ranks`` only those ranks of the job run, with
their real rank and world size; nothing in a dry run waits for the others (the fake process
group's collectives complete at once, and no rendezvous step counts the ranks).

This process imports what the script imports once, hosts the job's rendezvous store (as
torchrun's agent does), then forks one child per rank, at most W at a time; each child sets the rank's torchrun environment and runs the script
under a dry-run recording (``_launch``), writing DIR/rank<R>.json. Children share the
parent's imported modules copy-on-write, so a rank costs its own tensors and objects,
not a fresh interpreter. The first rank run prints to the terminal; the others to
DIR/rank<R>.log.

A rank is started only once the one started before it has begun its first forward, so
no two ranks load their model at once: loading is the phase in which a rank holds the
most host memory and the most threads (transformers' loader pool).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import select
import struct
import sys

_HEAVY_PREFIXES = (
    "torch",
    "torch_neuronx",
    "transformers",
    "trl",
    "accelerate",
    "peft",
    "diffusers",
    "datasets",
    "numpy",
)


def _script_path(target: list[str]) -> str | None:
    if target[0] == "-m":
        spec = importlib.util.find_spec(target[1])
        return spec.origin if spec is not None else None
    return target[0]


def preimport(target: list[str]) -> list[str]:
    """Imports the libraries the script imports anywhere (at its top or inside functions), and
    the names it imports from them (libraries such as transformers and trl load those lazily),
    so the forked ranks share them. Returns the modules imported."""
    path = _script_path(target)
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    wanted: dict = {}  # module -> names imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                wanted.setdefault(a.name, [])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted.setdefault(node.module, []).extend(a.name for a in node.names)
    done = []
    for name, attrs in wanted.items():
        if name.split(".")[0] not in _HEAVY_PREFIXES:
            continue
        try:
            module = importlib.import_module(name)
            for attr in attrs:
                getattr(module, attr, None)
            done.append(name)
        except Exception:  # the rank will raise it where the script imports it
            pass
    # What every dry-run rank imports: the fake tensor mode and Dynamo under it.
    importlib.import_module("torch._subclasses.fake_tensor")
    importlib.import_module("torch._dynamo")
    return done


def _rank_env(rank: int, nproc: int, world: int, port: int) -> dict:
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
        self._prev = _settings.set_rank_environment(_rank_env(self.rank, nproc, self.world, self._store.port))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        from neuronsim import settings as _settings

        if dist.is_initialized():
            dist.destroy_process_group()  # a fake group: no real run may use it
        _settings.set_rank_environment(self._prev)
        self._store = None


def _signal_first_forward(fd: int, rank: int) -> None:
    """Write ``rank`` to ``fd`` when the first module forward starts (the rank has loaded)."""
    import torch

    def hook(module, args):
        handle.remove()
        os.write(fd, struct.pack("<i", rank))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)


def _child(rank: int, env: dict, raw_dir: str, target: list[str], terminal: bool, loaded_fd: int) -> int:
    from neuronsim import settings as _settings

    _settings.set_rank_environment(env)
    _signal_first_forward(loaded_fd, rank)
    if not terminal:
        log = os.open(os.path.join(raw_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    from . import _launch

    return _launch.main(["--raw", raw_dir, "--dry-run"] + target)


def parse_ranks(spec: str, world: int | None = None) -> list[int]:
    """``"0,31"`` or ``"0-3,63"`` -> the sorted ranks it names (within ``world`` when given)."""
    ranks = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{spec!r} is not a list of ranks; write e.g. 0,31 or 0-3,63")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"{part.strip()!r} in {spec!r} is an empty range; write the lower rank first")
        ranks.update(range(first, last + 1))
    if world is not None and max(ranks) >= world:
        raise ValueError(f"rank {max(ranks)} is not in the job: its world size is {world} (ranks 0-{world - 1})")
    return sorted(ranks)


def run(raw_dir: str, nnodes: int, nproc: int, workers: int, target: list[str], ranks: list | None = None) -> int:
    """Runs the job's ranks (all, or only `ranks`: the others are not simulated, and nothing
    waits for them); returns the highest exit status."""
    import torch.distributed as dist

    from ._report import _ranges

    world = nnodes * nproc
    ranks = list(range(world)) if ranks is None else ranks
    if len(ranks) < world:
        print(
            f"torch-neuronx check: dry run of ranks {_ranges(ranks)} of {world}; the other {world - len(ranks)} are not run"
        )
    os.makedirs(raw_dir, exist_ok=True)
    preimport(target)
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    running: dict = {}  # pid -> rank
    loading: set = set()  # ranks started that have not begun their first forward
    loaded_r, loaded_w = os.pipe()
    worst = 0

    def wait_event() -> None:
        """Blocks until a rank exits or reports that it has loaded."""
        nonlocal worst
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                rank = running.pop(pid)
                loading.discard(rank)
                rc = os.waitstatus_to_exitcode(status)
                if rc:
                    worst = max(worst, rc if rc > 0 else 1)
                    if rank != ranks[0]:
                        print(
                            f"torch-neuronx check: rank {rank} exited with {rc}; its output: {raw_dir}/rank{rank}.log"
                        )
                return
            if select.select([loaded_r], [], [], 0.2)[0]:
                data = os.read(loaded_r, 4096)
                loading.difference_update(r for (r,) in struct.iter_unpack("<i", data))
                return

    for rank in ranks:
        while len(running) >= workers or loading:
            wait_event()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the rank
            rc = 1
            try:
                os.close(loaded_r)
                env = _rank_env(rank, nproc, world, store.port)
                rc = _child(rank, env, raw_dir, target, rank == ranks[0], loaded_w)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc if isinstance(rc, int) else 1)
        running[pid] = rank
        loading.add(rank)
    while running:
        wait_event()
    os.close(loaded_r)
    os.close(loaded_w)
    return worst


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torch_neuronx.readiness._ranks")
    p.add_argument("--raw", required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ranks", help="only these ranks of the job, e.g. 0,31 or 0-3,63 (default: all)")
    opts, target = p.parse_known_args(argv)
    if not target:
        p.error("give the script (or -m module) and its arguments")
    ranks = None
    if opts.ranks:
        try:
            ranks = parse_ranks(opts.ranks, opts.nnodes * opts.nproc_per_node)
        except ValueError as e:
            p.error(str(e))
    return run(opts.raw, opts.nnodes, opts.nproc_per_node, max(1, opts.workers), target, ranks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
