"""The launchers ``torch-neuronx check`` runs a job through, brought to the two it runs itself.

Check starts a job either as ``python [flags] (script | -m module | --entry module:attr name) args``
(one process, a rank under a recording) or as ``torchrun ...`` (one such rank per process; in a
dry run, the scheduler instead of torchrun). Every command is read here into a typed
:class:`Command` of one of those two forms, plus the environment variables its launcher would have
set for its processes, using the launcher's own code so that its flags and config files mean what
they mean to it:

* ``accelerate launch`` (also ``accelerate-launch`` and ``python -m accelerate.commands.launch``):
  accelerate's parser, ``_validate_launch_command`` (config file, defaults such as one process per
  visible NeuronCore) and ``prepare_multi_gpu_env`` / ``prepare_simple_launcher_cmd_env`` give the
  ``ACCELERATE_*`` / ``FSDP_*`` environment and the torchrun arguments or the python command.
* ``trl <training command>``: trl's CLI builds an ``accelerate launch`` of its own script
  (``trl/scripts/<command>.py``) through ``launch_training_script``; that function takes the
  launch step as a parameter, and check passes one that keeps accelerate's arguments instead of
  launching, then translates them as for ``accelerate launch``.
* Any other console script with a Python entry point: its entry point, called in the readiness
  launcher with ``sys.argv`` as the console script would set it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

ACCEPTED = (
    "python script.py | python -m module; torchrun ... | python -m torch.distributed.run ...; "
    "accelerate launch ... (or accelerate-launch, python -m accelerate.commands.launch); "
    "trl <command> ...; or another console script with a Python entry point"
)


class Unsupported(ValueError):
    """A command check cannot run (a usage error: check exits with status 2)."""


@dataclasses.dataclass
class Command:
    """A command check runs: its `launcher` (``python`` and its flags, or ``torchrun`` and its
    options), the `target` (script.py, ``-m module`` or ``--entry module:attr name``, with its
    arguments), and, for torchrun, the job's shape."""

    launcher: list
    target: list
    torchrun: bool = False
    nnodes: int = 1
    nproc_per_node: str = "1"  # torchrun's value: a number, or "auto", "cpu", "gpu", ...


def read(cmd: list[str]) -> tuple[Command, dict[str, str]]:
    """``cmd`` as the :class:`Command` check runs, and the environment variables its launcher would
    have set (beyond this process's environment)."""
    cmd, env = translate(cmd)
    exe = os.path.basename(cmd[0])
    if exe == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]:
        return _torchrun(cmd), env
    return _python(cmd), env


def _torchrun(cmd: list[str]) -> Command:
    from torch.distributed.run import get_args_parser

    head, rest = (cmd[:1], cmd[1:]) if os.path.basename(cmd[0]) == "torchrun" else (cmd[:3], cmd[3:])
    args = get_args_parser().parse_args(rest)
    if args.no_python:
        raise Unsupported("torchrun --no-python runs no Python script to check")
    i = len(rest) - len(args.training_script_args) - 1
    opts = [a for a in rest[:i] if a not in ("-m", "--module")]
    target = (["-m", rest[i]] if args.module else [rest[i]]) + rest[i + 1 :]
    nnodes = int(str(args.nnodes).split(":")[-1])
    return Command(head + opts, target, torchrun=True, nnodes=nnodes, nproc_per_node=str(args.nproc_per_node))


def _python(cmd: list[str]) -> Command:
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-m", "-c", "--entry"):
        i += 1
    if i >= len(cmd) or cmd[i] == "-c":
        raise Unsupported("give a script or -m module (python -c is not supported)")
    if cmd[i] == "-m" and i + 1 >= len(cmd):
        raise Unsupported("python -m needs a module name")
    return Command(cmd[:i], cmd[i:])


def translate(cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """``cmd`` as a python or torchrun command, and the environment variables its launcher would
    have set (beyond this process's environment)."""
    exe = os.path.basename(cmd[0])
    if exe == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]:
        return cmd, {}
    if exe == "accelerate" and cmd[1:2] == ["launch"]:
        return accelerate(cmd[2:])
    if exe == "accelerate-launch":
        return accelerate(cmd[1:])
    if _is_python(cmd[0]):
        i = next((k for k, a in enumerate(cmd[1:], 1) if not a.startswith("-") or a == "-m"), len(cmd))
        if cmd[i : i + 2] == ["-m", "accelerate.commands.launch"]:
            return accelerate(cmd[i + 2 :])
        return cmd, {}
    return console_script(cmd)


def _is_python(exe: str) -> bool:
    import shutil

    path = shutil.which(exe) or exe
    return os.path.basename(exe).startswith("python") or os.path.realpath(path) == os.path.realpath(sys.executable)


def accelerate(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``accelerate launch argv`` (its flags, then the script and its arguments)."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    parser.prog = "accelerate launch"
    return accelerate_args(parser.parse_args(argv))  # a usage error exits 2 with accelerate's message


def accelerate_args(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """What ``accelerate.commands.launch.launch_command(args)`` would start, as check runs it:
    the same choice of launcher, arguments and environment."""
    from accelerate.commands.config.config_args import ComputeEnvironment
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils import launch as acc_launch

    from neuronsim import settings as _settings

    try:
        args, defaults, _ = _validate_launch_command(args)
    except (ValueError, FileNotFoundError) as e:
        raise Unsupported(f"accelerate launch: {e}") from None
    if args.no_python:
        raise Unsupported("accelerate launch --no_python runs no Python script to check")
    if args.use_deepspeed and not args.cpu:
        raise Unsupported("accelerate launch with DeepSpeed starts the deepspeed launcher, which check cannot run")
    if getattr(args, "mpirun_hostfile", None) is not None:
        raise Unsupported("accelerate launch --mpirun_hostfile starts mpirun, which check cannot run")
    multi = (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu
    if not multi and (args.tpu or (defaults and defaults.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER)):
        raise Unsupported("accelerate launch on TPU or SageMaker is not a launch check can run")
    if multi:
        env = acc_launch.prepare_multi_gpu_env(args)
        cmd = [sys.executable, "-m", "torch.distributed.run"] + _torchrun_flags(args)
        cmd += [args.training_script] + list(args.training_script_args)
    else:
        cmd, env = acc_launch.prepare_simple_launcher_cmd_env(args)
    base = _settings.environ_copy()
    return cmd, {k: v for k, v in env.items() if base.get(k) != v}


def _torchrun_flags(args: argparse.Namespace) -> list[str]:
    """The torchrun flags of accelerate's namespace (as accelerate's multi-GPU launcher filters it)."""
    from accelerate.utils.launch import _filter_args
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    ns = _filter_args(args, parser, ["--training_script", args.training_script])
    flags = []
    for action in parser._actions:
        value = getattr(ns, action.dest, None)
        if not action.option_strings or action.dest == "help" or value == action.default or value is None:
            continue
        if action.nargs == 0:  # a switch
            flags += [action.option_strings[-1]] if value else []
        else:
            flags += [action.option_strings[-1], str(value)]
    return flags


def console_script(cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """A console script: trl's training commands through accelerate, any other entry point in
    the readiness launcher."""
    from importlib.metadata import entry_points

    name = os.path.basename(cmd[0])
    found = entry_points(group="console_scripts", name=name)
    if not found:
        raise Unsupported(f"cannot run {cmd[0]!r}: it is not a command check knows; check runs {ACCEPTED}")
    ep = next(iter(found))
    if ep.value.replace(" ", "") == "trl.cli:main":
        launched = trl(cmd[1:])
        if launched is not None:
            return launched
    return [sys.executable, "--entry", ep.value, name] + cmd[1:], {}


def trl(argv: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """``trl <command> argv``: for a training command, the ``accelerate launch`` trl would run
    (None for its other commands, which run as they are)."""
    import importlib
    from unittest import mock

    from trl.cli.commands import get_commands
    from trl.cli.commands.training import TrainingCommand

    training = {c.name for c in get_commands() if isinstance(c, TrainingCommand)}
    if not argv or argv[0] not in training:
        return None
    launcher = importlib.import_module("trl.cli.accelerate_launcher")
    kept = []
    keep = functools.partial(launcher.launch_training_script, launch_command_fn=kept.append)
    with mock.patch.object(launcher, "launch_training_script", keep):
        from trl.cli.main import main

        main(argv)
    return accelerate_args(kept[0])
