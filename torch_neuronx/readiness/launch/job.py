"""The job ``torch-neuronx check`` runs, typed: parsed once by the command line, written to the run's
directory as ``job.json``, and read by every rank (``rank``) and by the dry run's scheduler."""

from __future__ import annotations

import dataclasses
import json
import os


def groups_path(raw_dir: str, rank: int) -> str:
    """Where a rank of a dry run writes the process groups it has joined by its first forward."""
    return os.path.join(raw_dir, f"groups{rank}.json")


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """Which ranks of a job a dry run runs: one per class of equivalent ranks, proven alike by
    witnesses (``classes``, the default: ``launch.classes``), every rank, or those listed."""

    ranks: tuple | None = None  # listed ranks
    classes: bool = True  # without listed ranks: by classes (else every rank)

    @classmethod
    def parse(cls, text: str | None, world: int | None = None) -> "RankSpec":
        """``"0,31"`` or ``"0-3,63"`` (within ``world`` when given); "all": every rank; None or
        "classes": by classes."""
        if text is None or text.strip() == "classes":
            return cls()
        if text.strip() == "all":
            return cls(None, classes=False)
        ranks = set()
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                raise ValueError(f"{text!r} is not a list of ranks; write e.g. 0,31 or 0-3,63")
            first, last = int(lo), int(hi) if dash else int(lo)
            if last < first:
                raise ValueError(f"{part.strip()!r} in {text!r} is an empty range; write the lower rank first")
            ranks.update(range(first, last + 1))
        spec = cls(tuple(sorted(ranks)), classes=False)
        if world is not None:
            spec.check(world)
        return spec

    def check(self, world: int) -> None:
        """Raises ValueError when a rank listed is not in a job of `world` ranks."""
        if self.ranks and max(self.ranks) >= world:
            raise ValueError(
                f"rank {max(self.ranks)} is not in the job: its world size is {world} (ranks 0-{world - 1})"
            )

    def select(self, world: int) -> list:
        """The ranks of a job of `world` ranks a spec of listed ranks (or of every rank) runs."""
        return list(range(world)) if self.ranks is None else list(self.ranks)

    @property
    def listed(self) -> bool:
        return self.ranks is not None


@dataclasses.dataclass
class Job:
    """What every process of a checked run needs to know about it."""

    raw_dir: str  # where each rank writes rank<R>.json
    target: list  # script.py args | -m module args | --entry module:attr name args
    dry_run: bool = False
    nnodes: int = 1  # a dry run of a torchrun job: its shape, run by the scheduler
    nproc_per_node: int = 1
    workers: int = 2  # ranks of a dry run at once
    ranks: RankSpec = dataclasses.field(default_factory=RankSpec)
    # weights the command named that a dry run stands in for (the report lists them)
    absent_weights: list = dataclasses.field(default_factory=list)

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def path(self) -> str:
        return os.path.join(self.raw_dir, "job.json")

    def save(self) -> str:
        """Writes ``job.json`` into the run's directory; returns its path."""
        os.makedirs(self.raw_dir, exist_ok=True)
        d = dataclasses.asdict(self)
        d["ranks"] = {
            "ranks": None if self.ranks.ranks is None else list(self.ranks.ranks),
            "classes": self.ranks.classes,
        }
        with open(self.path, "w") as f:
            json.dump(d, f)
        return self.path

    @classmethod
    def load(cls, path: str) -> "Job":
        with open(path) as f:
            d = json.load(f)
        spec = d["ranks"]
        d["ranks"] = RankSpec(None if spec["ranks"] is None else tuple(spec["ranks"]), spec["classes"])
        return cls(**d)
