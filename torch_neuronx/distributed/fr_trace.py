"""``python -m torch_neuronx.distributed.fr_trace TRACE_DIR [fr_trace options]``: PyTorch's
Flight Recorder analyzer (``torch.distributed.flight_recorder.fr_trace``, unmodified) after
a check that every dump in TRACE_DIR is whole: a truncated or corrupt file is named, with
exit status 2, instead of ending the analyzer in an unpickling traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Check the dumps, then run PyTorch's analyzer with the same arguments."""
    from torch.distributed.flight_recorder import fr_trace
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    from .hangs import load_flight_recorder

    argv = list(sys.argv[1:] if argv is None else argv)
    args = JobConfig().parse_args(argv)
    prefix = args.prefix or ""
    names = sorted(n for n in os.listdir(args.trace_dir) if n.startswith(prefix) and n[len(prefix) :].isdigit())
    if not names:
        print(f"fr_trace: no dumps named {prefix or '<prefix>'}<rank> in {args.trace_dir}", file=sys.stderr)
        return 2
    for name in names:
        try:
            load_flight_recorder(os.path.join(args.trace_dir, name))
        except ValueError as e:
            print(f"fr_trace: {e}", file=sys.stderr)
            return 2
    fr_trace.main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
