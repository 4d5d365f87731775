"""The time model's results, typed: what an estimate says of a step, a phase, an op and a bucket.

A report keeps them as they are and writes them into report.json with :func:`as_data` (their
fields by name); benchmarks and tests read their fields.
"""

from __future__ import annotations

import dataclasses

# The terms a time splits into, in the order the report shows them.
TERMS = ("fixed", "compute", "memory", "collective latency", "collective bandwidth")
# The shares of a step the report's table shows: the terms, the collective ones together.
SHARES = ("compute", "memory", "fixed", "collectives")


def no_terms() -> dict:
    return dict.fromkeys(TERMS, 0.0)


@dataclasses.dataclass
class OpRow:
    """One op (or compiled graph, or collective) of a breakdown: its calls and their estimated time."""

    op: str
    dtype: str
    count: int = 0
    flops: int = 0
    bytes: int = 0
    seconds: float = 0.0
    fixed_seconds: float = 0.0
    compute_bound_calls: int = 0

    @property
    def bound(self) -> str:
        """What bounds most of its calls: "compute", "fixed" or "memory"."""
        if self.compute_bound_calls * 2 >= self.count:
            return "compute"
        return "fixed" if self.fixed_seconds * 2 >= self.seconds else "memory"


@dataclasses.dataclass
class Breakdown:
    """Where the time of a scope (a step, a phase's forward) goes."""

    terms: dict = dataclasses.field(default_factory=no_terms)  # term -> seconds
    # of the collective terms: asynchronous collectives' time that runs under compute
    hidden_seconds: float = 0.0
    term_shares: dict = dataclasses.field(default_factory=dict)
    dominant: str | None = None
    tensor_flops: dict = dataclasses.field(default_factory=dict)  # matmul-like FLOPs by dtype
    ops: list = dataclasses.field(default_factory=list)  # OpRow, costliest first


@dataclasses.dataclass
class Utilisation:
    """MFU: the matmul-like FLOPs over what the cores could do at their dense peak."""

    model_flops: int = 0
    mfu_dtype: str | None = None
    peak_flops: float | None = None
    mfu: float | None = None


@dataclasses.dataclass
class PhaseEstimate(Breakdown):
    """A generation phase (prefill or decode step): its median forward, on the slowest rank."""

    seconds: float = 0.0
    count: int = 0  # forwards of this phase
    tokens: int | None = None
    mfu: float | None = None
    mfu_dtype: str | None = None
    model_flops: int = 0


@dataclasses.dataclass
class Phases:
    """The phases of a generation, or why they are not estimated (`missing`)."""

    prefill: PhaseEstimate | None = None
    decode: PhaseEstimate | None = None
    missing: str | None = None

    def items(self) -> list:
        """[(phase name, PhaseEstimate)] of the phases estimated."""
        return [(k, p) for k, p in (("prefill", self.prefill), ("decode", self.decode)) if p is not None]


@dataclasses.dataclass
class RankEstimate(Breakdown):
    """One rank's step: its time, and the breakdown of its median step (or of the whole run)."""

    rank: int = 0
    step_seconds: float = 0.0
    bucket_seconds: list = dataclasses.field(default_factory=list)
    per_step: bool = False  # optimizer steps were seen: the time is per step, else of the whole run
    shares: dict = dataclasses.field(default_factory=dict)  # of SHARES
    # a pipeline-parallel step: the time its schedule's critical path leaves ranks idle (in step_seconds)
    bubble_seconds: float = 0.0


@dataclasses.dataclass
class Estimate(RankEstimate, Utilisation):
    """The estimate of the recorded ranks on one chip: the slowest rank's step, the MFU over all of
    them, the phases of a generation. `missing` says why there is none (a figure AWS does not publish)."""

    chip: str = ""
    lnc: int = 1
    instance: str | None = None
    missing: str | None = None
    figures: dict | None = None  # the per-core figures the model used
    phases: Phases | None = None
    target: bool = False  # the report's target instance (the others are for comparison)


@dataclasses.dataclass
class BucketEstimate:
    """One bucket (a step, or a region) of a recording, for scripts that compose their own estimate."""

    seconds: float
    hidden_seconds: float
    terms: dict
    tensor_flops: dict


def as_data(result) -> dict:
    """A result as report.json holds it: its fields by name (phases by their names)."""
    d = dataclasses.asdict(result)
    phases = getattr(result, "phases", None)
    if isinstance(phases, Phases):
        d["phases"] = (
            {"missing": phases.missing} if phases.missing else {k: d["phases"][k] for k in ("prefill", "decode")}
        )
    return d
