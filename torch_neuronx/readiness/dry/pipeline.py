"""A pipeline schedule's step in a dry run: the micro-batches that differ, not all of them.

A step of a 1F1B schedule runs every micro-batch through the same stage module: the first sets
up (a backward with no gradient to add to) and the last finishes (gradient reduction), every
other is the same work on the same shapes. Stage s of S holds at most S - s micro-batches in
flight (its warm-up forwards and the first of its steady state), so its memory peak is reached
within its first S - s + 1: the next forward, with the first backward's gradients held. A dry run
of such a step runs that many on stage s, and at least 3 (the first, one in between to time, the
last): ``microbatches_to_run``. The schedule is given the first micro-batches of the batch (split
and merged by its own chunk specs), and the script gets back a loss for every micro-batch (a
micro-batch run's, whose value a dry run does not know anyway) and the merged outputs at their
full size: after the last micro-batch's forward, its stage holds placeholders of the outputs of
the micro-batches not run, as the script's step holds theirs until it merges them (the memory of
a step that returns its outputs grows with its micro-batches), and the stage is prepared (its
receive buffers, one per micro-batch) for all of them.

A stage runs fewer micro-batches than the stage before it, so after its step it takes that
stage's activations of the others and sends it their gradients (of the inputs' shapes, values
not known), through the stage's own send and receive ops: both stages issue the messages of
every micro-batch either ran, so neither waits and their sends and receives pair up.

The recording keeps the schedule's order for all the script's micro-batches and each action
run, so the time model times the step the script asked for (``estimate.pipeline``: the first's
and last's times, and the repeated ones' for the others); the report says how many ran.

Other schedules (GPipe keeps every micro-batch in flight; interleaved and zero-bubble schedules
precompute their order for the script's count) run every micro-batch.
"""

from __future__ import annotations

from .. import _torch_private as _tp

_SHORTENED = ("Schedule1F1B",)  # schedules whose micro-batches in flight are bounded by the stages


def microbatches_to_run(schedule_name: str, microbatches: int, stages: int, stage: int) -> int:
    """How many of a step's micro-batches a dry run runs on `stage` (see the module's docstring)."""
    if schedule_name not in _SHORTENED:
        return microbatches
    return min(microbatches, max(3, stages - stage + 1))


def _placeholders(out, count: int) -> list:
    """`count` tensors (or structures of them) of the sizes of output `out`, without values."""
    import torch

    return [
        _tp.tree_map(lambda t: torch.empty_like(t) if isinstance(t, torch.Tensor) else t, out) for _ in range(count)
    ]


def _hold_the_rest(stage, m: int, n: int) -> None:
    """Give the stage (for one step) a forward that, after micro-batch m - 1, holds placeholders of
    the outputs of the micro-batches m .. n - 1 (see the module's docstring)."""
    forward = stage.forward_one_chunk

    def forward_one_chunk(chunk_id, *args, **kwargs):
        out = forward(chunk_id, *args, **kwargs)
        if chunk_id == m - 1 and stage.output_chunks:
            stage.output_chunks.extend(_placeholders(stage.output_chunks[-1], n - m))
        return out

    stage.forward_one_chunk = forward_one_chunk


def shortened_step(orig):
    """``step()`` of a pipeline schedule, running the micro-batches that differ (the module's docstring)."""

    def step(schedule, *args, target=None, losses=None, **kwargs):
        facts = _tp.schedule_facts(schedule)
        n, name, stages = facts["microbatches"], facts["schedule"], facts["stages"]
        index = facts["stage_indices"][0]  # a shortened schedule runs one stage per rank
        m = microbatches_to_run(name, n, stages, index)
        if m >= n:
            return orig(schedule, *args, target=target, losses=losses, **kwargs)
        options = {k: kwargs.pop(k) for k in ("return_outputs", "loss_kwargs") if k in kwargs}
        _tp.initialize_stage(schedule, args, kwargs, target)  # its buffers for all n micro-batches
        args, kwargs, target = _tp.first_microbatches(schedule, args, kwargs, target, m)
        run_losses = [] if losses is not None else None
        stage = _tp.schedule_stages(schedule)[0]
        old = _tp.set_microbatches(schedule, m)
        _hold_the_rest(stage, m, n)
        try:
            out = orig(schedule, *args, target=target, losses=run_losses, **kwargs, **options)
        finally:
            _tp.set_microbatches(schedule, old)
            del stage.forward_one_chunk  # the instance's own attribute: back to the class's method
        if index > 0:  # the micro-batches the stage before ran and this one did not (the docstring)
            _tp.pass_microbatches(stage, range(m, microbatches_to_run(name, n, stages, index - 1)))
        if losses is not None and run_losses:
            losses.extend(run_losses[i % len(run_losses)] for i in range(n))
        return out

    return step


def shortened_steps_tap():
    """The tap that shortens every pipeline schedule's step for one dry run."""
    return _tp.ScheduleStepTap(shortened_step)
