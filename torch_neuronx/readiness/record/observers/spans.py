"""Steps and regions: which buckets an op, collective or compiled graph is counted in."""

from __future__ import annotations

import threading

from ..recording import Bucket


class Spans:
    """The run's buckets: one per optimizer step (then the ops after the last), the regions
    the user opened with ``readiness.region``, and any other open bucket (a generation
    forward's). Every count goes to each open bucket."""

    def __init__(self):
        self.steps: list = [Bucket()]
        self.regions: list = []  # in order of entry
        self._open: list = [self.steps[0]]
        self._on_step: list = []  # called before each new step bucket opens
        self._hooks: list = []
        self._depth = threading.local()  # optimizer steps under way in this thread

    def count_op(self, key) -> None:
        for b in self._open:
            b.ops[key] += 1

    def count_collective(self, key) -> None:
        for b in self._open:
            b.collectives[key] += 1

    def count_graph(self, name: str) -> None:
        for b in self._open:
            b.graphs[name] += 1

    def open(self, bucket: Bucket) -> None:
        self._open.append(bucket)

    def close(self, bucket: Bucket) -> None:
        if bucket in self._open:
            self._open.remove(bucket)

    def open_region(self, name: str) -> Bucket:
        b = Bucket(name=name)
        self.regions.append(b)
        self.open(b)
        return b

    # -- optimizer steps ----------------------------------------------------------------------
    def on_step(self, callback) -> None:
        """Call `callback()` at every optimizer step, before the step's bucket closes."""
        self._on_step.append(callback)

    def start(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._hooks = [register_optimizer_step_pre_hook(self._enter), register_optimizer_step_post_hook(self._step)]

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _enter(self, optimizer, args, kwargs) -> None:
        self._depth.n = getattr(self._depth, "n", 0) + 1

    def _step(self, optimizer, args, kwargs) -> None:
        # A step inside another optimizer's step is part of it: a container of optimizers
        # (torchtitan's, one per model part) is an Optimizer whose step() steps each of them.
        self._depth.n = max(getattr(self._depth, "n", 1) - 1, 0)
        if self._depth.n:
            return
        for callback in self._on_step:
            callback()
        i = self._open.index(self.steps[-1])
        self.steps.append(Bucket())
        self._open[i] = self.steps[-1]

    @property
    def n_steps(self) -> int:
        return len(self.steps) - 1
