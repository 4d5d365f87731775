"""A dry run of a torchrun job: every rank, without a Python interpreter's imports per rank.

``python -m torch_neuronx.readiness.launch.scheduler --job DIR/job.json``: what ``torch-neuronx
check --dry-run`` starts for ``torchrun``. With the job's rank spec (``--ranks``) only those ranks
of the job run, with their real rank and world size; nothing in a dry run waits for the others
(the fake process group's collectives complete at once, and no rendezvous step counts the ranks).

This process imports what the script imports once, hosts the job's rendezvous store (as
torchrun's agent does), then forks one child per rank, at most the job's ``workers`` at a time;
each child sets the rank's torchrun environment and runs the script under a dry-run recording
(``rank``), writing DIR/rank<R>.json. Children share the parent's imported modules copy-on-write,
so a rank costs its own tensors and objects, not a fresh interpreter. The first rank run prints
to the terminal; the others to DIR/rank<R>.log.

A rank is started only once the one started before it has begun its first forward, so
no two ranks load their model at once: loading is the phase in which a rank holds the
most host memory and the most threads (transformers' loader pool).
"""

from __future__ import annotations

import gc
import os
import select
import shutil
import struct
import sys
import time

from ..dry import mailbox
from . import rank as _rank
from .job import Job, groups_path

# What a rank tells the parent, as (rank, event) on the pipe: each message is written at once.
_LOADED, _WAITS, _RUNS = 0, 1, 2
# Reading a process's proportional set size walks its page tables (a few ms for a forked rank):
# sample no more often than this, and spend at most a twentieth of the time between samples on it.
_MEMORY_PERIOD, _MEMORY_DUTY = 0.2, 20


def pss_bytes(pid: int) -> int:
    """A process's proportional set size: a page shared by n processes counts 1/n in each, so
    forked ranks that share their parent's imported modules are not counted once per rank."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _signal_first_forward(fd: int, rank: int, raw_dir: str) -> None:
    """Tell the parent when the first module forward or compile starts (the rank has loaded), with
    the process groups it has joined by then (a dry run by classes plans from rank 0's)."""
    import torch

    from .._torch_private import on_compile_start

    signalled = []

    def signal(*_):
        if signalled:
            return
        signalled.append(True)
        handle.remove()
        _write_groups(raw_dir, rank)
        os.write(fd, struct.pack("<ii", rank, _LOADED))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(signal)
    # Dynamo traces global module hooks into the graph of a compiled module (and cannot trace
    # handle.remove()): a first forward that is compiled signals as its compile starts, in eager
    # code, before Dynamo reads the hooks. The callback stays (a no-op): removing it while Dynamo
    # runs its callbacks would skip the next one.
    on_compile_start(signal)


def _write_groups(raw_dir: str, rank: int) -> None:
    import json

    from ..record.session import current

    session = current()
    if session is None:
        return
    groups = session.recorder.sequence.describe_groups()
    facts = session.recorder.pipeline.facts  # a pipeline's stages are a dimension of the job
    data = {
        "groups": {n: {"desc": g.desc, "ranks": g.ranks} for n, g in groups.items()},
        "pipeline": facts["group"] if facts is not None else None,
    }
    with open(groups_path(raw_dir, rank) + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(groups_path(raw_dir, rank) + ".tmp", groups_path(raw_dir, rank))


def _child(rank: int, env: dict, job: Job, terminal: bool, loaded_fd: int, ranks) -> int:
    from neuronsim import settings as _settings

    _settings.set_rank_environment(env)
    _signal_first_forward(loaded_fd, rank, job.raw_dir)

    # a rank that waits for a peer's message does not count among those running at once; its
    # groups are built by then (it may wait before its first forward: a pipeline's shape inference)
    def notify(waits: bool) -> None:
        if waits:
            _write_groups(job.raw_dir, rank)
        os.write(loaded_fd, struct.pack("<ii", rank, _WAITS if waits else _RUNS))

    mailbox.configure(job.raw_dir, rank, ranks, notify)
    if not terminal:
        log = os.open(os.path.join(job.raw_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    return _rank.run(job)


class _Scheduler:
    """Forks the ranks, at most `workers` at a time and one loading at a time; tracks their exits.
    A rank that waits for another's message (a pipeline stage's) is not counted while it waits."""

    def __init__(self, job: Job, ranks: list):
        self.job, self.raw_dir, self.workers = job, job.raw_dir, max(1, job.workers)
        self.first, self.ranks = ranks[0], ranks  # the ranks of this round (a message's peers)
        self.running: dict = {}  # pid -> rank
        self.loading: set = set()  # ranks started that have not begun their first forward
        self.waiting: set = set()  # ranks waiting for a message from another rank
        self.started = 0
        self.loaded_r, self.loaded_w = os.pipe()
        self.worst = 0
        self.exited: dict = {}  # rank -> exit status
        self.host_peak = 0  # bytes: the most the ranks running at once held (PSS), with this process
        self._next_memory_sample = 0.0

    def round(self, ranks: list, started: int = 0) -> None:
        """Run `ranks` next (`started` of them already running): the ranks a deadlock is told among."""
        self.ranks, self.started = list(ranks), started

    def wait_event(self) -> None:
        """Blocks until a rank exits or reports that it has loaded."""
        while True:
            self._sample_memory()
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                self._exited(self.running.pop(pid), os.waitstatus_to_exitcode(status))
                return
            if self.waiting and self.started == len(self.ranks) and self.waiting == set(self.running.values()):
                mailbox.find_deadlock(self.raw_dir, self.waiting)
            if select.select([self.loaded_r], [], [], 0.2)[0]:
                for rank, event in struct.iter_unpack("<ii", os.read(self.loaded_r, 4096)):
                    self.loading.discard(rank)  # a rank that waits is not loading either
                    if event == _WAITS:
                        self.waiting.add(rank)
                    elif event == _RUNS:
                        self.waiting.discard(rank)
                return

    def _sample_memory(self) -> None:
        now = time.monotonic()
        if now < self._next_memory_sample:
            return
        total = 0
        for pid in [os.getpid(), *self.running]:
            try:
                total += pss_bytes(pid)
            except (OSError, ValueError, IndexError):  # exited meanwhile; or no /proc
                pass
        self.host_peak = max(self.host_peak, total)
        self._next_memory_sample = now + max(_MEMORY_PERIOD, _MEMORY_DUTY * (time.monotonic() - now))

    def _exited(self, rank: int, rc: int) -> None:
        self.exited[rank] = rc
        self.loading.discard(rank)
        self.waiting.discard(rank)
        if rc:
            self.worst = max(self.worst, rc if rc > 0 else 1)
            if rank != self.first:
                print(f"torch-neuronx check: rank {rank} exited with {rc}; its output: {self.raw_dir}/rank{rank}.log")

    def start(self, rank: int, env: dict) -> None:
        while len(self.running) - len(self.waiting) >= self.workers or self.loading:
            self.wait_event()
        sys.stdout.flush()
        sys.stderr.flush()
        # The parent's objects (the modules it imported for the ranks) move out of the collector's
        # reach: a rank's full collection (torchtitan runs one at start) would otherwise write to
        # every one of them and so copy the pages the ranks share (Python's advice for fork
        # without exec)
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the rank
            rc = 1
            try:
                os.close(self.loaded_r)
                rc = _child(rank, env, self.job, rank == self.first, self.loaded_w, self.ranks)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc if isinstance(rc, int) else 1)
        self.running[pid] = rank
        self.loading.add(rank)
        self.started += 1

    def drain(self) -> None:
        """Wait for every rank started to end."""
        while self.running:
            self.wait_event()

    def finish(self) -> int:
        self.drain()
        # left: the ranks' markers, and messages no rank received (the recordings list those sends)
        shutil.rmtree(os.path.join(self.raw_dir, "p2p"), ignore_errors=True)
        os.close(self.loaded_r)
        os.close(self.loaded_w)
        return self.worst


def run(job: Job) -> int:
    """Runs the job's ranks (by classes, all, or those of its rank spec: the others are not
    simulated, and nothing waits for them); returns the highest exit status."""
    import torch.distributed as dist

    from ..report.text import ranges
    from .preimport import preimport

    shutil.rmtree(os.path.join(job.raw_dir, "p2p"), ignore_errors=True)  # messages of an earlier run: never read
    preimport(job.target)
    store = dist.TCPStore("127.0.0.1", 0, job.world, is_master=True, wait_for_workers=False)
    env = lambda r: _rank.rank_env(r, job.nproc_per_node, job.world, store.port)  # noqa: E731
    if job.ranks.classes:
        from .by_classes import run_by_classes

        return run_by_classes(job, _Scheduler(job, [0]), env)
    ranks = job.ranks.select(job.world)
    if len(ranks) < job.world:
        print(
            f"torch-neuronx check: dry run of ranks {ranges(ranks)} of {job.world}; "
            f"the other {job.world - len(ranks)} are not run"
        )
    scheduler = _Scheduler(job, ranks)
    for rank in ranks:
        scheduler.start(rank, env(rank))
    return scheduler.finish()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--job":
        print("usage: python -m torch_neuronx.readiness.launch.scheduler --job DIR/job.json", file=sys.stderr)
        return 2
    try:
        return run(Job.load(argv[1]))
    finally:
        gc.unfreeze()  # so that the interpreter's shutdown frees them (native extensions check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
