"""The policy: does it fit (here and on every chip), the verdict's problems, and which chips are estimated."""

from __future__ import annotations

import dataclasses
import enum

from neuronsim import hardware as hw

from ..estimate.steps import estimate
from .text import fmt_bytes, ranges


def ranks_run_phrase(d) -> str:
    """ "rank 0 (1 of 64 ranks run)", "ranks 0-3, 63 (5 of 64 ranks run)"."""
    n = len(d["ranks_run"])
    return f"rank{'s' if n > 1 else ''} {ranges(d['ranks_run'])} ({n} of {d['world_size']} ranks run)"


def is_oom(error) -> bool:
    return bool(error) and ("OutOfMemoryError" in error or "out of memory" in error.lower())


def fit(memory, cap) -> list:
    peak_alloc = max([m["peak_allocated"] for m in memory] + [0])
    peak_res = max([m["peak_reserved"] for m in memory] + [0])
    oom = any(m["oom"] for m in memory)
    rows = []
    for name, chip in hw.CHIPS.items():
        for n in chip.lnc_allowed:
            capacity = chip.per_core(n)["hbm_bytes"]
            if oom and capacity <= cap:
                fits = "no (ran out of memory)"
            elif oom:  # the run stopped at the failed allocation: its peak is only a lower bound
                fits = f"unknown (ran out of memory at {fmt_bytes(cap)}, so it needs more than that)"
            elif peak_res <= capacity:
                fits = "yes"
            elif peak_alloc <= capacity:
                fits = "yes, with a smaller allocator cache"
            else:
                fits = "no"
            rows.append({"chip": name, "lnc": n, "capacity": capacity, "fits": fits})
    return rows


class ProblemKind(str, enum.Enum):
    """What stands between the script and a native run on Trainium, costliest first."""

    HANG = "will hang"
    DISAGREE = "collectives disagree"
    FAILED = "failed"
    WONT_FIT = "will not fit"
    RECOMPILES = "recompiles every step"
    FALLBACKS = "runs with fallbacks"


@dataclasses.dataclass
class Problem:
    """One problem of the verdict: its kind and the phrase the verdict line says it in."""

    kind: ProblemKind
    text: str


# A finding of the comparison across ranks as the verdict names it (one, the costliest, is named).
_ACROSS = {"hang": ProblemKind.HANG, "disagree": ProblemKind.DISAGREE, "graphs": ProblemKind.HANG}


def problems(d) -> list:
    """The verdict's problems, costliest first, from the report's data."""
    out = []
    across = d.get("across_ranks") or {}
    for kind, problem in _ACROSS.items():  # the costliest first: a hang
        first = next((f for f in across.get("findings", []) if f["kind"] == kind), None)
        if first is not None:
            out.append(Problem(problem, f"{problem.value}: {first['message']}"))
            break
    for rank, err in d["errors"].items():
        if not is_oom(err):
            out.append(Problem(ProblemKind.FAILED, f"failed on rank {rank}: {err.splitlines()[0][:160]}"))
            break
    if not all(m["fits"] for m in d["memory"]):
        worst = max(d["memory"], key=lambda m: (m["oom"], m["peak_allocated"]))
        why = "ran out of memory" if worst["oom"] else f"peak {fmt_bytes(worst['peak_allocated'])} allocated"
        text = (
            f"will not fit: {why} on {worst['label']}, capacity "
            f"{fmt_bytes(d['capacity_per_core'])} per core on {d['instance_type']} at LNC={d['lnc']}"
        )
        out.append(Problem(ProblemKind.WONT_FIT, text))
    if d["compile"]["recompiles_every_step"]:
        out.append(Problem(ProblemKind.RECOMPILES, "recompiles every step"))
    if d["fallbacks"]:
        n = len(d["fallbacks"])
        calls = sum(f["count"] for f in d["fallbacks"])
        out.append(
            Problem(ProblemKind.FALLBACKS, f"runs with {n} fallback{'s' if n > 1 else ''} ({calls} calls on CPU)")
        )
    return out


def verdict_line(found: list, d) -> str:
    """The verdict: its problems in one line ("runs natively" without any), and whose it is."""
    line = "; ".join(p.text for p in found) if found else "runs natively"
    if d["ranks_not_run"]:
        line += f" (on {ranks_run_phrase(d)}; the others unknown)"
    return line


# Chips estimated besides the target instance's own, which comes first.
_CHIPS_ESTIMATED = ("trn2", "trn3")


def _counterpart(inst, chip: str) -> str:
    """The instance of `chip` shaped like `inst` (as many chips), else its first one."""
    same_chip = [i for i in hw.INSTANCES.values() if i.chip == chip]
    return next((i.name for i in same_chip if i.chips == inst.chips), same_chip[0].name)


def chip_estimates(raws, inst, lnc, prec) -> list:
    """The target instance's chip first, at the target LNC; then the other chips, each on its
    instance shaped like the target, at the same LNC where the chip allows it."""
    out = []
    for chip in [inst.chip] + [c for c in _CHIPS_ESTIMATED if c != inst.chip]:
        target = chip == inst.chip
        allowed = hw.CHIPS[chip].lnc_allowed
        n = lnc if target or lnc in allowed else hw.CHIPS[chip].lnc_default
        name = inst.name if target else _counterpart(inst, chip)
        e = estimate(raws, chip, n, prec, instance=name)
        e.target = target
        out.append(e)
    return out
