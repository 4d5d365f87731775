"""Runs a user's script under a readiness recording (one process, one rank).

``python -m torch_neuronx.readiness._launch --raw DIR [--dry-run] (script.py | -m module |
--entry module:attr name) [args]``:
what ``torch-neuronx check`` starts, directly or through torchrun (or, for a dry run of
several ranks, in each rank the rank launcher forks). The recording goes to
DIR/rank<RANK>.json; the script's exit status is this process's. ``--entry`` runs a console
script's entry point (``module:attr``, as in its entry_points.txt) the way its generated
wrapper does: ``sys.argv[0]`` is the script's name and the function's result is the exit status.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def _runner(rest: list[str]):
    """What runs the target (sys.argv set as its own launcher sets it); None after a usage error."""
    if rest[0] == "--entry":
        if len(rest) < 3:
            print("_launch: --entry needs module:attr and the script's name", file=sys.stderr)
            return None
        from importlib.metadata import EntryPoint

        entry = EntryPoint(rest[2], rest[1], "console_scripts")
        sys.argv = rest[2:]
        return lambda: sys.exit(entry.load()())
    if rest[0] == "-m":
        if len(rest) < 2:
            print("_launch: -m needs a module name", file=sys.stderr)
            return None
        sys.argv = [rest[1]] + rest[2:]
        return lambda: runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    sys.argv = list(rest)
    sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))  # as `python script.py` does
    return lambda: runpy.run_path(rest[0], run_name="__main__")


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv[2:3]
    if dry_run:
        argv = argv[:2] + argv[3:]
    if len(argv) < 3 or argv[0] != "--raw":
        print(
            "usage: python -m torch_neuronx.readiness._launch --raw DIR [--dry-run] "
            "(script.py | -m module | --entry module:attr name) [args]",
            file=sys.stderr,
        )
        return 2
    raw_dir, rest = argv[1], argv[2:]
    run = _runner(rest)
    if run is None:
        return 2

    from ._session import Session

    session = Session(dry_run)
    session.start()
    rc, error, exit_code = 0, None, None
    try:
        run()
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
        os.makedirs(raw_dir, exist_ok=True)
        path = os.path.join(raw_dir, f"rank{recording.rank}.json")
        with open(path + ".tmp", "w") as f:
            f.write(recording.to_json())
        os.replace(path + ".tmp", path)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
