"""Shared runner of the NKI tutorial examples: check against PyTorch, print the cost."""

import argparse
import os
import sys

import torch

from torch_neuronx import nki


def check_and_report(kernel, reference, *args, atol=1e-4, rtol=1e-4, target="trn2", **kwargs):
    """Run ``kernel`` in the simulator on neuron tensors, compare with ``reference`` on CPU,
    and print the cost model's estimate next to the unfused PyTorch op sequence."""
    dev_args = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args]
    out = kernel(*dev_args, **kwargs)
    expected = reference(*args, **kwargs)
    torch.testing.assert_close(out.cpu(), expected, atol=atol, rtol=rtol)
    print(f"{kernel.__name__}: output on {out.device} matches PyTorch " f"(shape {tuple(out.shape)}, {out.dtype})")
    comparison = nki.compare(kernel, reference, *args, platform_target=target, **kwargs)
    print(comparison)
    return comparison


def _parse_command_line():
    # The tutorial scripts read their one optional argument (the target) from sys.argv; check it
    # here, on import, so that --help or a bad argument answers before any kernel runs.
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if script is None or os.path.dirname(os.path.abspath(script)) != os.path.dirname(os.path.abspath(__file__)):
        return
    p = argparse.ArgumentParser(
        prog=f"python {sys.argv[0]}",
        description=(main.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="?",
        default="trn2",
        choices=["trn2", "trn3"],
        help="Trainium generation of the cost model (default: trn2)",
    )
    p.parse_args()


_parse_command_line()
