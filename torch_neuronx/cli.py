"""``torch-neuronx``: command-line entry point of the package.

Subcommands::

    torch-neuronx ls [--json]        same as ``neuron-ls``
    torch-neuronx demo [options]     train a tiny Llama on the neuron device (see ``demo --help``)
    torch-neuronx check [options] -- python train.py [args]
                                     will the script run natively on Trainium, fit, how fast
    torch-neuronx --version
"""

from __future__ import annotations

import sys

USAGE = """\
usage: torch-neuronx [-h] [--version] {ls,demo,check} ...

AWS Trainium as the PyTorch device `neuron` (NeuronCore simulator when no hardware).

subcommands:
  ls      list Neuron devices and NeuronCores (same as `neuron-ls`; --json for JSON)
  demo    train a tiny Llama-style language model on `neuron` and generate text
  check   run a script (`check -- python train.py`, `-- torchrun ...`, `-- accelerate launch ...`)
          on the simulator
          and report whether it runs natively on Trainium, fits in HBM, and its estimated speed

Run `torch-neuronx <subcommand> --help` for the options of a subcommand.
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"torch-neuronx {version('torch-neuronx')}")
        except PackageNotFoundError:
            print("torch-neuronx (not installed)")
        return 0

    cmd, rest = argv[0], argv[1:]
    if cmd == "ls":
        from .tools import neuron_ls

        return neuron_ls.main(rest, prog="torch-neuronx ls")
    if cmd == "demo":
        from . import demo

        return demo.main(rest)
    if cmd == "check":
        from .readiness.launch import cli as _cli

        return _cli.main(rest)
    print(USAGE, end="", file=sys.stderr)
    print(f"torch-neuronx: error: unknown subcommand {cmd!r} (choose from 'ls', 'demo', 'check')", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
