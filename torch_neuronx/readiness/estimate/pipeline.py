"""A pipeline-parallel step along its schedule: the critical path of the actions every rank runs.

The recording of each stage holds the schedule's own order of actions for every rank of the
pipeline (torch.distributed.pipelining's IR: GPipe, 1F1B, interleaved and zero-bubble schedules
alike) and, per stage and kind of action, the ops of the micro-batches it ran. Each action then
takes its stage's time per micro-batch, and starts once its rank is free and what it needs is
done: a micro-batch's forward on stage s needs stage s-1's forward of it; its backward ("B", or
the inputs' half "I") on stage s needs stage s+1's backward of it (the last stage: its own
forward); a weights' half ("W") needs its stage's "I". A dependency between ranks adds the time
of the activation's (or its gradient's) transfer. The step's pipeline part is when the last
action ends: the bubble is the difference from the busiest rank's own work.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class StageTimes:
    """Seconds of one stage's actions, by kind ("F", "B", "I", "W"): of each micro-batch run, in
    order. A step's first and last micro-batch take the first's and last's time (they set up and
    finish: unsharding, gradient reduction), every other the mean of those in between."""

    seconds: dict  # kind -> [seconds of micro-batch 0, 1, ...] as run

    def time(self, kind: str, mb: int, n: int) -> float:
        """Seconds of action `kind` of micro-batch `mb` of a step of `n`."""
        run = self.seconds.get(kind)
        if not run:
            return 0.0
        if mb == 0 or len(run) == 1:
            return run[0]
        if mb == n - 1:
            return run[-1]
        middle = run[1:-1] or run[:1]
        return sum(middle) / len(middle)


def _needs(action: tuple, last_stage: int):
    """The action `action` (stage, kind, micro-batch) waits for, or None."""
    stage, kind, mb = action
    if kind == "F":
        return (stage - 1, "F", mb) if stage > 0 else None
    if kind in ("B", "I"):
        return (stage + 1, "B", mb) if stage < last_stage else (stage, "F", mb)
    if kind == "W":
        return (stage, "I", mb)
    return None


def critical_path(order: dict, stages: dict, hop_seconds: float = 0.0) -> float:
    """When the last action of `order` ({rank: [(stage, kind, micro-batch)]}) ends, each taking
    ``stages[stage].seconds[kind]`` (see the module's docstring); ValueError when the order cannot
    complete (a rank waits for an action no rank runs before it)."""
    where = {a[0]: rank for rank, actions in order.items() for a in actions}
    last_stage = max(where) if where else 0
    n = microbatches(order)
    done: dict = {}  # (stage, kind, mb) -> end time ("B" and "I" both satisfy a backward's needs)
    free = dict.fromkeys(order, 0.0)
    nxt = dict.fromkeys(order, 0)
    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for rank, actions in order.items():
            while nxt[rank] < len(actions):
                action = actions[nxt[rank]]
                need = _needs(action, last_stage)
                ready = 0.0
                if need is not None:
                    got = done.get(need, done.get((need[0], "I", need[2])) if need[1] == "B" else None)
                    if got is None:
                        break
                    ready = got + (hop_seconds if where.get(need[0]) != rank else 0.0)
                end = max(free[rank], ready) + stages[action[0]].time(action[1], action[2], n)
                done[action] = free[rank] = end
                nxt[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = {r: a[nxt[r]] for r, a in order.items() if nxt[r] < len(a)}
            raise ValueError(f"the pipeline schedule cannot complete: ranks wait for {waiting}")
    return max(free.values(), default=0.0)


def busiest_rank(order: dict, stages: dict) -> float:
    """The most work any rank of `order` does (its actions' seconds, without waiting)."""
    n = microbatches(order)
    return max((sum(stages[s].time(k, mb, n) for s, k, mb in actions) for actions in order.values()), default=0.0)


def microbatches(order: dict) -> int:
    """The micro-batches of a step of the schedule `order`."""
    return 1 + max((a[2] for actions in order.values() for a in actions if a[2] is not None), default=0)
