"""``torch_neuronx.readiness``: will this script run natively on Trainium, fit, and how fast.

In process::

    with torch_neuronx.readiness() as r:
        train()
    print(r.report)            # or r.report.save("neuron-readiness")

From the shell: ``torch-neuronx check -- python train.py`` (or ``-- torchrun ...``).
"""

from __future__ import annotations

import sys
import types

from ._checkpoint import header_only_checkpoint
from ._report import Report

__all__ = ["Readiness", "Report", "readiness", "header_only_checkpoint"]


class Readiness:
    """Context manager recording a run on the simulator; ``.report`` after it exits.

    instance / lnc: the Trainium configuration to judge against (default: the one the
    simulator runs, TORCH_NEURONX_INSTANCE_TYPE / NEURON_LOGICAL_NC_CONFIG).
    capacity: HBM bytes per logical core for the fit verdict instead of the instance's.
    out: a directory to write report.{md,html,json} and the pictures to on exit.
    dry_run: run the block at its real size with no data (see docs/readiness.md, "Dry run"):
    every tensor made inside it is a fake one, the allocator accounting is real.
    Entering resets the devices' peak memory statistics, so the peaks are the block's.
    """

    def __init__(
        self,
        instance: str | None = None,
        lnc: int | None = None,
        capacity: int | None = None,
        out: str | None = None,
        dry_run: bool = False,
    ):
        from .. import _hardware

        if instance is not None:
            _hardware.instance(instance)  # raises a clear error for an unknown name
        self._options = {"instance": instance, "lnc": lnc, "capacity": capacity}
        self.out = out
        self.dry_run = dry_run
        self.report: Report | None = None
        self._collector = None
        self._dry = None

    def __enter__(self) -> "Readiness":
        from ._collect import Collector

        if self._collector is not None:
            raise RuntimeError("a readiness() context cannot be entered twice; create a new one")
        if self.dry_run:
            from ._dryrun import DryRun

            self._dry = DryRun()
            self._dry.start()
        self._collector = Collector(self._dry)
        self._collector.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        c = self._collector
        c.stop()
        if self._dry is not None:
            self._dry.stop()
        if exc is not None:
            c.error = f"{exc_type.__name__}: {exc}"
        self.report = Report([c.raw()], **self._options)
        if self.out:
            self.report.save(self.out)

    def raw(self) -> dict:
        """This process's recording (what ``torch-neuronx check`` merges across ranks)."""
        return self._collector.raw()


def readiness(
    instance: str | None = None,
    lnc: int | None = None,
    capacity: int | None = None,
    out: str | None = None,
    dry_run: bool = False,
) -> Readiness:
    """Record the code in a ``with`` block and judge it against Trainium (see :class:`Readiness`)."""
    return Readiness(instance=instance, lnc=lnc, capacity=capacity, out=out, dry_run=dry_run)


class _CallableModule(types.ModuleType):
    # `torch_neuronx.readiness` is this package, and `torch_neuronx.readiness()` the context.
    def __call__(self, *args, **kwargs) -> Readiness:
        return readiness(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
