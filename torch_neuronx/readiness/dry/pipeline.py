"""A pipeline schedule's step in a dry run: the micro-batches that differ, not all of them.

A step of a 1F1B schedule runs every micro-batch through the same stage module: after its
warmup (as many forwards as there are stages) every micro-batch is the same work on the same
shapes, and at most as many are in flight at once as there are stages, so the memory peak is
reached within the first ``stages + 1``. A dry run of such a step runs only those: the schedule
is given the first ``stages + 1`` micro-batches of the batch (split and merged by its own chunk
specs), and the script gets back a loss for every micro-batch (a micro-batch run's, whose value
a dry run does not know anyway) and the merged outputs at their full size. The recording keeps
the schedule's order for all the script's micro-batches and counts the actions run, so the time
model times the step the script asked for (``estimate.pipeline``); the report says how many ran.

Other schedules (GPipe keeps every micro-batch in flight; interleaved and zero-bubble schedules
precompute their order for the script's count) run every micro-batch.
"""

from __future__ import annotations

import math

from .. import _torch_private as _tp

_SHORTENED = ("Schedule1F1B",)  # schedules whose micro-batches in flight are bounded by the stages


def microbatches_to_run(schedule_name: str, microbatches: int, stages: int) -> int:
    """How many of a step's micro-batches a dry run runs (see the module's docstring)."""
    if schedule_name not in _SHORTENED:
        return microbatches
    return min(microbatches, stages + 1)


def _full_size(out, m: int, n: int):
    """Merged outputs of `m` micro-batches as those of `n`: the same values repeated along the batch."""
    import torch

    if isinstance(out, torch.Tensor):
        reps = math.ceil(n / m)
        rows = out.shape[0] * n // m
        return torch.cat([out] * reps)[:rows] if reps > 1 else out
    if isinstance(out, (list, tuple)):
        return type(out)(_full_size(o, m, n) for o in out)
    if isinstance(out, dict):
        return {k: _full_size(v, m, n) for k, v in out.items()}
    return out


def shortened_step(orig):
    """``step()`` of a pipeline schedule, running the micro-batches that differ (the module's docstring)."""

    def step(schedule, *args, target=None, losses=None, **kwargs):
        facts = _tp.schedule_facts(schedule)
        n = facts["microbatches"]
        m = microbatches_to_run(facts["schedule"], n, facts["stages"])
        if m >= n:
            return orig(schedule, *args, target=target, losses=losses, **kwargs)
        options = {k: kwargs.pop(k) for k in ("return_outputs", "loss_kwargs") if k in kwargs}
        args, kwargs, target = _tp.first_microbatches(schedule, args, kwargs, target, m)
        run_losses = [] if losses is not None else None
        old = _tp.set_microbatches(schedule, m)
        try:
            out = orig(schedule, *args, target=target, losses=run_losses, **kwargs, **options)
        finally:
            _tp.set_microbatches(schedule, old)
        if losses is not None and run_losses:
            losses.extend(run_losses[i % len(run_losses)] for i in range(n))
        return _full_size(out, m, n)

    return step


def shortened_steps_tap():
    """The tap that shortens every pipeline schedule's step for one dry run."""
    return _tp.ScheduleStepTap(shortened_step)
