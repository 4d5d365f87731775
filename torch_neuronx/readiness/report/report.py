"""The readiness report: built from the ranks' recordings, rendered as text, Markdown, HTML, JSON."""

from __future__ import annotations

import json
import os

from neuronsim import hardware as hw

from ..estimate import assumptions
from ..estimate.results import as_data
from . import formats, merge, plots, render, verdict


class Report:
    """What a run on the simulator says about running it on Trainium.

    ``verdict`` is one line; ``problems`` its typed findings, ``estimates`` (one :class:`Estimate`
    per chip, the target's first) and ``findings`` (the ranks compared) the typed results;
    ``data`` holds everything as saved in report.json; ``summary()``, ``to_markdown()``,
    ``to_html()`` render it; ``save(dir)`` writes all.
    """

    def __init__(
        self,
        recordings: list,
        instance: str | None = None,
        lnc: int | None = None,
        capacity: int | None = None,
        command: str | None = None,
        classes: dict | None = None,
    ):
        raws = sorted(recordings, key=lambda r: r.rank)
        if not raws:
            raise ValueError("no rank wrote a recording: the script did not start")
        inst = hw.instance(instance or raws[0].instance_type)
        # The simulator's LNC stands unless the target cannot run it (trn1 has LNC=1 only).
        recorded = int(raws[0].lnc)
        lnc = int(lnc or (recorded if recorded in inst.spec.lnc_allowed else inst.spec.lnc_default))
        if lnc not in inst.spec.lnc_allowed:
            raise ValueError(f"{inst.name} supports LNC={inst.spec.lnc_allowed}, not LNC={lnc}")
        if capacity is not None and capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity}")
        cap = int(capacity) if capacity else inst.spec.per_core(lnc)["hbm_bytes"]
        d = {
            "command": command,
            "instance_type": inst.name,
            "lnc": lnc,
            "capacity_per_core": cap,
            "capacity_is_override": bool(capacity),
            "ranks": len(raws),
            **merge.ranks_run(raws, classes),
            "classes": classes,
            "steps": raws[0].steps,
            "wall_seconds": max(r.wall_seconds for r in raws),
            "errors": {r.rank: r.error for r in raws if r.error},
            "recorder_errors": {r.rank: r.recorder_errors for r in raws if r.recorder_errors},
        }
        d["fallbacks"] = merge.fallbacks(raws)
        d["compile"] = merge.compile_story(raws)
        d["memory"] = merge.memory(raws, cap, classes)
        d["memory_per_rank"] = merge.memory_per_rank(raws, classes)
        d["dry_run"] = merge.dry_run(raws)
        d["fit"] = verdict.fit(d["memory"], cap)
        d["collectives"] = merge.collectives(raws)
        self.findings = merge.findings(raws)
        d["across_ranks"] = merge.across_ranks(raws, self.findings)
        self.estimates = verdict.chip_estimates(raws, inst, lnc, raws[0].fp32_precision)
        d["estimates"] = [as_data(e) for e in self.estimates]
        d["assumptions"] = list(assumptions.ASSUMPTIONS) + assumptions.approximations(raws)
        self.problems = verdict.problems(d)
        d["verdict"] = verdict.verdict_line(self.problems, d)
        self.data = d

    @property
    def verdict(self) -> str:
        return self.data["verdict"]

    def to_json(self) -> str:
        d = dict(self.data)
        # the memory curve at most ~2000 points per core
        d["memory"] = [dict(m, series=m["series"][:: max(1, len(m["series"]) // 2000)]) for m in d["memory"]]
        return json.dumps(d, indent=1, default=str)

    # -- rendering -------------------------------------------------------------
    def summary(self) -> str:
        return formats.summary(self.data)

    def to_markdown(self, images: dict | None = None, note: str | None = None) -> str:
        """Markdown; `images` maps a caption to a file name next to the report; `note` ends it."""
        return formats.markdown(self.data, images, note)

    def to_html(self, pngs: dict | None = None, note: str | None = None) -> str:
        """One self-contained HTML page; `pngs` maps a caption to PNG bytes (embedded); `note` ends it."""
        return formats.html_page(self.data, pngs, note)

    def pictures(self) -> dict:
        """{caption: PNG bytes}: memory over time per core, estimated time per op.

        Empty, with one warning per process, when matplotlib is not installed.
        """
        if not plots.available():
            render.warn_no_pictures()
            return {}
        out = {"Memory over time": plots.memory_png(self.data["memory"], self.data["capacity_per_core"])}
        timed = [e for e in self.data["estimates"] if not e["missing"]]
        if timed:
            out["Estimated time per op"] = plots.ops_png(timed)
        return out

    def save(self, directory: str) -> dict:
        """Write report.json, report.md, report.html and the PNGs (when matplotlib is installed); return their paths."""
        os.makedirs(directory, exist_ok=True)
        pngs = self.pictures()
        names = {caption: render.PICTURE_FILES[caption] for caption in pngs}
        note = None if pngs else plots.MISSING
        paths = {}
        for caption, blob in pngs.items():
            paths[names[caption]] = os.path.join(directory, names[caption])
            with open(paths[names[caption]], "wb") as f:
                f.write(blob)
        texts = {
            "report.json": self.to_json(),
            "report.md": self.to_markdown(names, note=note),
            "report.html": self.to_html(pngs, note=note),
        }
        for name, text in texts.items():
            paths[name] = os.path.join(directory, name)
            with open(paths[name], "w") as f:
                f.write(text)
        return paths

    def __str__(self) -> str:
        return self.summary()
