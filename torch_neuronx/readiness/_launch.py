"""Runs a user's script under a readiness recording (one process, one rank).

``python -m torch_neuronx.readiness._launch --raw DIR [--dry-run] (script.py | -m module) [args]``:
what ``torch-neuronx check`` starts, directly or through torchrun (or, for a dry run of
several ranks, in each rank the rank launcher forks). The recording goes to
DIR/rank<RANK>.json; the script's exit status is this process's.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv[2:3]
    if dry_run:
        argv = argv[:2] + argv[3:]
    if len(argv) < 3 or argv[0] != "--raw":
        print(
            "usage: python -m torch_neuronx.readiness._launch --raw DIR [--dry-run] (script.py | -m module) [args]",
            file=sys.stderr,
        )
        return 2
    raw_dir, rest = argv[1], argv[2:]
    if rest[0] == "-m":
        if len(rest) < 2:
            print("_launch: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = [rest[1]] + rest[2:]

        def run():
            runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(rest)
        sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))  # as `python script.py` does

        def run():
            runpy.run_path(rest[0], run_name="__main__")

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
