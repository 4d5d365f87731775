"""``torch_neuronx.readiness``: will this script run natively on Trainium, fit, and how fast.

In process::

    with torch_neuronx.readiness() as r:
        train()
    print(r.report)            # or r.report.save("neuron-readiness")

From the shell: ``torch-neuronx check -- python train.py`` (or ``-- torchrun ...``,
``-- accelerate launch ...``, ``-- trl sft ...``, another console script).

The package is five wings, each a subpackage whose docstring says what it owns and what it
may import (``tests/readiness/test_layering.py`` checks both), over one module of private
PyTorch details, in the order a run goes through them::

    launch ──▶ record ──▶ (dry) ──▶ estimate ──▶ report
    cli, launchers,   session,        executor, mode,    time_model,      merge, desync,
    job, scheduler,   recorder,       accounting,        collective_time, verdict, render,
    rank, preimport   observers,      values, reads,     steps, results,  formats, plots,
                      measure,        collective_values, assumptions,     text
                      recording,      mailbox, objects,  known_error
                      ledger, real    parameters, taps,
                                      checkpoints

``launch`` runs the others; ``record`` runs a script under one session and writes the typed
``Recording`` (a session is handed its executor: ``record.real`` or ``dry.executor``); ``dry``
executes a script with no data; ``estimate`` and ``report`` read recordings only. Every private
PyTorch detail is in ``_torch_private``, and nowhere else. Collectives' names and rules come from
``neuronsim.collectives``. Of the rest of torch_neuronx, readiness imports only ``_C``,
``_sites`` (where a call came from), ``neuron`` (memory counters), ``profiler`` (the
compiled-graph listener), and the hooks of ``distributed`` (process-group override, groups
joined, acting after a module's import) and ``_dynamo`` (compiling without code generation) a
dry run and the recorder use;
nothing below imports readiness (``tests/neuron/test_layering.py``).
"""

from __future__ import annotations

import sys
import types

from .dry.checkpoints import header_only_checkpoint
from .dry.reads import ValueUnknownError
from .estimate.model import TimeModel
from .record.recording import Recording
from .record.session import region
from .report import Report

__all__ = [
    "Readiness",
    "Recording",
    "Report",
    "TimeModel",
    "ValueUnknownError",
    "readiness",
    "region",
    "header_only_checkpoint",
]


class Readiness:
    """Context manager recording a run on the simulator; ``.report`` after it exits.

    instance / lnc: the Trainium configuration to judge against (default: the one the
    simulator runs, TORCH_NEURONX_INSTANCE_TYPE / NEURON_LOGICAL_NC_CONFIG).
    capacity: HBM bytes per logical core for the fit verdict instead of the instance's.
    out: a directory to write report.{md,html,json} and the pictures to on exit.
    dry_run: run the block at its real size with no data (see docs/readiness.md, "Dry run"):
    every tensor made inside it is a fake one, the allocator accounting is real.
    rank / world_size (dry run only): run the block as rank `rank` of a job of `world_size`
    ranks: ``init_process_group("neuron")`` inside it gets that rank and world size (and
    DeviceMesh its real coordinates); the other ranks are not run, and the report says so.
    Entering resets the devices' peak memory statistics, so the peaks are the block's.
    """

    def __init__(
        self,
        instance: str | None = None,
        lnc: int | None = None,
        capacity: int | None = None,
        out: str | None = None,
        dry_run: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        from neuronsim import hardware as _hardware

        if instance is not None:
            _hardware.instance(instance)  # raises a clear error for an unknown name
        self._as_rank = None
        if rank is not None or world_size is not None:
            if not dry_run or rank is None or world_size is None:
                raise ValueError(
                    "rank and world_size go together and need dry_run=True: "
                    "readiness(dry_run=True, rank=R, world_size=N) runs the block as rank R of N"
                )
            from .launch.rank import AsRank

            self._as_rank = AsRank(rank, world_size)
        self._options = {"instance": instance, "lnc": lnc, "capacity": capacity}
        self.out = out
        self.dry_run = dry_run
        self.report: Report | None = None
        self.recording: Recording | None = None
        self._session = None

    def __enter__(self) -> "Readiness":
        from .record.session import Session

        if self._session is not None:
            raise RuntimeError("a readiness() context cannot be entered twice; create a new one")
        if self.dry_run:
            from .dry.executor import DryExecutor

            executor = DryExecutor()
        else:
            from .record.real import RealExecutor

            executor = RealExecutor()
        self._session = Session(executor, self._as_rank)
        self._session.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.recording = self._session.stop(exc)
        self.report = Report([self.recording], **self._options)
        if self.out:
            self.report.save(self.out)


def readiness(
    instance: str | None = None,
    lnc: int | None = None,
    capacity: int | None = None,
    out: str | None = None,
    dry_run: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
) -> Readiness:
    """Record the code in a ``with`` block and judge it against Trainium (see :class:`Readiness`)."""
    return Readiness(
        instance=instance, lnc=lnc, capacity=capacity, out=out, dry_run=dry_run, rank=rank, world_size=world_size
    )


class _CallableModule(types.ModuleType):
    # `torch_neuronx.readiness` is this package, and `torch_neuronx.readiness()` the context.
    def __call__(self, *args, **kwargs) -> Readiness:
        return readiness(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
