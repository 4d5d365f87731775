"""Pipeline parallelism: the schedule a rank runs (torch.distributed.pipelining) and its actions.

At each ``step()`` of a pipeline schedule the observer notes what the schedule is (its class,
micro-batches, stages, and every rank's actions in order), and each action a stage runs for one
micro-batch (forward, backward, or its halves) opens a bucket of its own besides the step's, by
stage, kind and micro-batch: those of the last step are kept (the first also builds the stages),
and the time model composes a step from them along the schedule.
"""

from __future__ import annotations

import contextlib

from ... import _torch_private
from ..recording import Bucket, PipelineRecord


class Pipeline:
    """The schedule seen last and the actions' buckets of every step (`record()`: None without one)."""

    def __init__(self, spans):
        self.spans = spans
        self.facts: dict | None = None
        self.steps = 0
        self.actions: dict = {}  # "stage:kind" -> Bucket
        self.ran: dict = {}  # "stage:kind" -> actions run
        self._taps = (_torch_private.ScheduleStepTap(self._stepping), _torch_private.PipelineActionTap(self._action))

    def start(self) -> None:
        for tap in self._taps:
            tap.install()

    def stop(self) -> None:
        for tap in self._taps:
            tap.remove()

    def _stepping(self, orig):
        observer = self

        def step(schedule, *args, **kwargs):
            observer.facts = _torch_private.schedule_facts(schedule)  # before a dry run shortens it
            observer.steps += 1
            observer.actions, observer.ran = {}, {}  # this step's
            return orig(schedule, *args, **kwargs)

        return step

    @contextlib.contextmanager
    def _action(self, stage: int, kind: str, microbatch):
        key = f"{stage}:{kind}:{microbatch}"
        bucket = self.actions.get(key)
        if bucket is None:  # a micro-batch's loss joins its forward's bucket, counted once
            bucket = self.actions[key] = Bucket(name=key)
            self.ran[f"{stage}:{kind}"] = self.ran.get(f"{stage}:{kind}", 0) + 1
        self.spans.open(bucket)
        try:
            yield
        finally:
            self.spans.close(bucket)

    def record(self) -> PipelineRecord | None:
        if self.facts is None:
            return None
        return PipelineRecord(
            **self.facts, actions={k: b.typed() for k, b in self.actions.items()}, ran=dict(self.ran), steps=self.steps
        )
