"""``torch-neuronx check -- python train.py [args]`` (or ``-- torchrun ...``, ``-- accelerate launch ...``,
a console script: see ``launchers``): the command line, the job it starts, and the report at the end."""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

from .job import Job, RankSpec
from .launchers import Command, Unsupported, read

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 24GiB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _rank_spec(text: str) -> RankSpec:
    try:
        return RankSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torch-neuronx check",
        description="Run a script unmodified on the NeuronCore simulator and report whether it would run "
        "natively on Trainium, fit in HBM, and how fast (estimated).",
        epilog="examples:\n  torch-neuronx check -- python train.py --epochs 1\n"
        "  torch-neuronx check --out rep -- torchrun --nproc-per-node 2 train.py\n"
        "  torch-neuronx check --dry-run -- accelerate launch --num_processes 2 train.py\n"
        "  torch-neuronx check -- trl sft --model_name_or_path ./model --dataset_name ./data\n"
        "commands check runs: python script.py or -m module, torchrun, python -m torch.distributed.run,\n"
        "  accelerate launch, and console scripts with a Python entry point (trl sft ... through accelerate)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="neuron-readiness", help="report directory (default: %(default)s)")
    p.add_argument(
        "--instance",
        help="instance type to judge against and simulate (default: " "TORCH_NEURONX_INSTANCE_TYPE or trn2.3xlarge)",
    )
    p.add_argument("--lnc", type=int, help="logical NeuronCore config, 1 or 2 (default: the instance's)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="run at the real model and world size with no data: every rank of a torchrun job in "
        "this machine's memory, tensors without memory behind them, the allocator's accounting real",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="with --dry-run and a job of several processes (torchrun, accelerate launch): how many ranks run at once (default: %(default)s)",
    )
    p.add_argument(
        "--ranks",
        type=_rank_spec,
        help="with --dry-run and a job of several processes: which ranks to run. 'classes' (the default): one "
        "rank per class of ranks that do the same work, the others proven alike by witnesses and answered "
        "from their class; 'all': every rank; or a list, e.g. 0,31 or 0-3,63 (each keeps its real rank, "
        "world size and mesh coordinates; the report says which ranks were not run)",
    )
    p.add_argument(
        "--capacity",
        type=_bytes,
        help="HBM per logical core for the fit verdict, e.g. 16GiB " "(default: the instance's)",
    )
    return p


def _child(command: Command, job: Job) -> list[str]:
    """The command that runs `job`: a rank under a recording in place of the script (through
    torchrun for a real torchrun job; for a dry run of one, the scheduler instead of torchrun)."""
    if job.dry_run and command.torchrun:
        return [sys.executable, "-m", "torch_neuronx.readiness.launch.scheduler", "--job", job.path]
    if job.ranks != RankSpec():  # --ranks given, for one process
        raise Unsupported(
            "--ranks needs --dry-run and a job of several processes (torchrun, accelerate launch); for one "
            "process, use torch_neuronx.readiness(dry_run=True, rank=R, world_size=N)"
        )
    return command.launcher + ["-m", "torch_neuronx.readiness.launch.rank", "--job", job.path]


def _job(command: Command, raw_dir: str, opts, absent: list) -> Job:
    """The job of `command`, its rank spec checked against the job's world size."""
    ranks = opts.ranks or RankSpec()
    job = Job(raw_dir, command.target, opts.dry_run, workers=opts.workers, ranks=ranks, absent_weights=absent)
    if opts.dry_run and command.torchrun:
        try:
            job.nnodes, job.nproc_per_node = command.nnodes, int(command.nproc_per_node)
        except ValueError:
            raise Unsupported(f"--dry-run: give --nproc-per-node as a number, not {command.nproc_per_node!r}") from None
        try:
            job.ranks.check(job.world)
        except ValueError as e:
            raise Unsupported(f"--ranks: {e}") from None
    return job


def _prepare(cmd: list[str], raw_dir: str, opts, env: dict) -> list[str]:
    """The child command (its launcher's variables added to `env`), with the job it runs saved.
    A launcher that reads the device count (accelerate: one process per core) sees the instance's."""
    from neuronsim import settings as _settings

    if opts.ranks is not None and not opts.dry_run:
        raise Unsupported("--ranks needs --dry-run (a real run runs every rank)")
    absent = []
    if opts.dry_run:  # a real run needs the weights: transformers' own error, as without check
        from ..dry.checkpoints import stand_ins

        cmd, absent = stand_ins(cmd, os.path.join(raw_dir, "weights"))
        for a in absent:
            if a["class"] is None:  # said before the script runs into the library's own error
                print(f"torch-neuronx check --dry-run: {a['path']}: no stand-in ({a['reason']})", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        for name in ("TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG"):
            if name in env:
                stack.enter_context(_settings.override(name, env[name]))
        command, extra = read(cmd)
    env.update(extra)
    job = _job(command, raw_dir, opts, absent)
    job.save()
    return _child(command, job)


def _read_json(path: str):
    import json

    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _keep_recordings(raws: list, out: str) -> None:
    """Each rank's typed recording next to the report, as recordings/rank<N>.json
    (``Recording.from_json`` reads one back): what the report was merged from."""
    directory = os.path.join(out, "recordings")
    os.makedirs(directory, exist_ok=True)
    for r in raws:
        with open(os.path.join(directory, f"rank{r.rank}.json"), "w") as f:
            f.write(r.to_json())


def main(argv: list[str]) -> int:
    if "--" in argv:
        k = argv.index("--")
        own, cmd = argv[:k], argv[k + 1 :]
    else:
        own, cmd = argv, []
    opts = _parser().parse_args(own)
    if not cmd:
        _parser().print_usage(sys.stderr)
        print(
            "torch-neuronx check: error: give the command after --, e.g. " "`torch-neuronx check -- python train.py`",
            file=sys.stderr,
        )
        return 2
    from neuronsim import hardware as _hardware
    from neuronsim import settings as _settings

    try:
        inst = _hardware.instance(opts.instance)
    except ValueError as e:
        print(f"torch-neuronx check: error: {e}", file=sys.stderr)
        return 2
    env = _settings.environ_copy()
    env["TORCH_NEURONX_INSTANCE_TYPE"] = inst.name
    if opts.lnc:
        env["NEURON_LOGICAL_NC_CONFIG"] = str(opts.lnc)
    with tempfile.TemporaryDirectory(prefix="neuron-readiness-") as raw_dir:
        try:
            child = _prepare(cmd, raw_dir, opts, env)
        except Unsupported as e:
            print(f"torch-neuronx check: error: {e}", file=sys.stderr)
            return 2
        rc = subprocess.call(child, env=env)
        from ..record.recording import Recording

        raws = []
        for path in sorted(glob.glob(os.path.join(raw_dir, "rank*.json"))):
            with open(path) as f:
                raws.append(Recording.from_json(f.read()))
        classes = _read_json(os.path.join(raw_dir, "classes.json"))
    if not raws:
        print(
            f"torch-neuronx check: the command exited with status {rc} before any rank started recording",
            file=sys.stderr,
        )
        return rc or 1
    from ..report import Report

    report = Report(
        raws, instance=inst.name, lnc=opts.lnc, capacity=opts.capacity, command=shlex.join(cmd), classes=classes
    )
    paths = report.save(opts.out)
    _keep_recordings(raws, opts.out)
    print(report.summary())
    print(f"  report           {paths['report.html']} (also report.md, report.json)")
    return rc
