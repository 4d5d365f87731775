"""``torch-neuronx check -- python train.py [args]`` (or ``-- torchrun ...``, ``-- accelerate launch ...``,
a console script: see ``_launchers``)."""

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

from ._launchers import Unsupported

_LAUNCH = ["-m", "torch_neuronx.readiness._launch"]
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 24GiB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _rank_spec(text: str) -> str:
    from ._ranks import parse_ranks

    try:
        parse_ranks(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


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
        help="with --dry-run and a job of several processes: simulate only these ranks of the job, e.g. 0,31 or 0-3,63 "
        "(each keeps its real rank, world size and mesh coordinates; the report says which ranks were "
        "not run; default: all)",
    )
    p.add_argument(
        "--capacity",
        type=_bytes,
        help="HBM per logical core for the fit verdict, e.g. 16GiB " "(default: the instance's)",
    )
    return p


def _child_command(
    cmd: list[str], raw_dir: str, dry_run: bool = False, workers: int = 2, ranks: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The user's command with the script wrapped by the readiness launcher (for a dry run of
    a torchrun job: the rank launcher, which runs every rank, or those of `ranks`, without torchrun),
    and the environment variables its launcher sets. Other launchers are translated first (raises
    ``_launchers.Unsupported`` for a command check cannot run)."""
    if ranks and not dry_run:
        raise SystemExit("torch-neuronx check: --ranks needs --dry-run (a real run runs every rank)")
    from ._launchers import translate

    cmd, env = translate(cmd)
    return _wrapped(cmd, raw_dir, dry_run, workers, ranks), env


def _wrapped(cmd: list[str], raw_dir: str, dry_run: bool, workers: int, ranks: str | None) -> list[str]:
    exe = os.path.basename(cmd[0])
    launch = _LAUNCH + ["--raw", raw_dir] + (["--dry-run"] if dry_run else [])
    if exe == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]:
        head, rest = (cmd[:1], cmd[1:]) if exe == "torchrun" else (cmd[:3], cmd[3:])
        from torch.distributed.run import get_args_parser

        args = get_args_parser().parse_args(rest)
        if args.no_python:
            raise SystemExit("torch-neuronx check: torchrun --no-python runs no Python script to check")
        i = len(rest) - len(args.training_script_args) - 1
        opts = [a for a in rest[:i] if a not in ("-m", "--module")]
        target = ["-m", rest[i]] if args.module else [rest[i]]
        if dry_run:
            nnodes = int(str(args.nnodes).split(":")[-1])
            try:
                nproc = int(args.nproc_per_node)
            except ValueError:
                raise SystemExit(
                    f"torch-neuronx check --dry-run: give --nproc-per-node as a number, not {args.nproc_per_node!r}"
                ) from None
            launcher = [sys.executable, "-m", "torch_neuronx.readiness._ranks", "--raw", raw_dir]
            launcher += ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--workers", str(workers)]
            if ranks:
                from ._ranks import parse_ranks

                try:
                    parse_ranks(ranks, nnodes * nproc)
                except ValueError as e:
                    raise SystemExit(f"torch-neuronx check --ranks: {e}") from None
                launcher += ["--ranks", ranks]
            return launcher + target + rest[i + 1 :]
        return head + opts + launch + target + rest[i + 1 :]
    if ranks:
        raise SystemExit(
            "torch-neuronx check: --ranks needs --dry-run and a job of several processes (torchrun, accelerate "
            "launch); for one process, use torch_neuronx.readiness(dry_run=True, rank=R, world_size=N)"
        )
    i = 1  # a python command (the translation's other form)
    flags = []
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-m", "-c", "--entry"):
        flags.append(cmd[i])
        i += 1
    if i >= len(cmd) or cmd[i] == "-c":
        raise SystemExit("torch-neuronx check: give a script or -m module (python -c is not supported)")
    return [cmd[0]] + flags + launch + cmd[i:]


def _prepare(cmd: list[str], raw_dir: str, opts, env: dict) -> tuple[list[str], list]:
    """The child command (its launcher's variables added to `env`) and the weights a dry run stands in for.
    A launcher that reads the device count (accelerate: one process per core) sees the instance's."""
    from neuronsim import settings as _settings

    run, absent = cmd, []
    if opts.dry_run:  # a real run needs the weights: transformers' own error, as without check
        from ._checkpoints import _stand_ins

        run, absent = _stand_ins(cmd, os.path.join(raw_dir, "weights"))
        for a in absent:
            if a["class"] is None:  # said before the script runs into the library's own error
                print(f"torch-neuronx check --dry-run: {a['path']}: no stand-in ({a['reason']})", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        for name in ("TORCH_NEURONX_INSTANCE_TYPE", "NEURON_LOGICAL_NC_CONFIG"):
            if name in env:
                stack.enter_context(_settings.override(name, env[name]))
        child, extra = _child_command(run, raw_dir, opts.dry_run, opts.workers, opts.ranks)
    env.update(extra)
    return child, absent


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
            child, absent = _prepare(cmd, raw_dir, opts, env)
        except Unsupported as e:
            print(f"torch-neuronx check: error: {e}", file=sys.stderr)
            return 2
        rc = subprocess.call(child, env=env)
        from ._record import Recording

        raws = []
        for path in sorted(glob.glob(os.path.join(raw_dir, "rank*.json"))):
            with open(path) as f:
                raws.append(Recording.from_json(f.read()))
    if not raws:
        print(
            f"torch-neuronx check: the command exited with status {rc} before any rank started recording",
            file=sys.stderr,
        )
        return rc or 1
    from ._report import Report

    report = Report(
        raws, instance=inst.name, lnc=opts.lnc, capacity=opts.capacity, command=shlex.join(cmd), absent_weights=absent
    )
    paths = report.save(opts.out)
    _keep_recordings(raws, opts.out)
    print(report.summary())
    print(f"  report           {paths['report.html']} (also report.md, report.json)")
    return rc
