"""The readiness report: built from the ranks' recordings, rendered as text, Markdown, HTML, JSON.

``merge`` turns the ranks' recordings into the report's data, ``verdict`` judges it (fit,
verdict, which chips to estimate), ``render`` writes it out.
"""

from __future__ import annotations

import base64
import html
import json
import os

from neuronsim import hardware as hw

from .. import _estimate
from .._text import fmt_bytes
from . import merge, render, verdict


class Report:
    """What a run on the simulator says about running it on Trainium.

    ``verdict`` is one line; ``data`` holds everything (as saved in report.json);
    ``summary()``, ``to_markdown()``, ``to_html()`` render it; ``save(dir)`` writes all.
    """

    def __init__(
        self,
        recordings: list,
        instance: str | None = None,
        lnc: int | None = None,
        capacity: int | None = None,
        command: str | None = None,
        absent_weights: list | None = None,
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
            **merge.ranks_run(raws),
            "steps": raws[0].steps,
            "wall_seconds": max(r.wall_seconds for r in raws),
            "errors": {r.rank: r.error for r in raws if r.error},
            "collector_errors": {r.rank: r.recorder_errors for r in raws if r.recorder_errors},
        }
        d["fallbacks"] = merge.fallbacks(raws)
        d["compile"] = merge.compile_story(raws)
        d["memory"] = merge.memory(raws, cap)
        d["memory_per_rank"] = merge.memory_per_rank(raws)
        d["dry_run"] = merge.dry_run(raws)
        if d["dry_run"] is not None:
            d["dry_run"]["absent_weights"] = list(absent_weights or [])
        d["fit"] = verdict.fit(d["memory"], cap)
        d["collectives"] = merge.collectives(raws)
        prec = raws[0].fp32_precision
        d["estimates"] = verdict.chip_estimates(raws, inst, lnc, prec)
        d["assumptions"] = list(_estimate.ASSUMPTIONS)
        d["verdict"] = verdict.verdict(d)
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
        d = self.data
        lines = [f"torch-neuronx readiness{' (dry run)' if d['dry_run'] else ''}: {d['verdict']}"]
        lines.append(
            f"  target           {d['instance_type']}, LNC={d['lnc']}, {render.ranks_phrase(d)}, "
            f"{d['steps']} optimizer step(s) seen"
        )
        if d["ranks_not_run"]:
            lines.append(f"  not run          {render.not_run_sentence(d)}")
        n_calls = sum(f["count"] for f in d["fallbacks"])
        lines.append(f"  CPU fallbacks    {len(d['fallbacks'])} op(s), {n_calls} call(s)")
        for f in d["fallbacks"][:5]:
            lines.append(f"    - {f['op']} [{f['dtype']}] x{f['count']} at {next(iter(f['sites']))}")
        c = d["compile"]
        if c["graphs"] or c["graph_breaks"]:
            lines.append(
                f"  torch.compile    {len(c['graphs'])} graph(s), {c['graph_break_total']} graph break(s), "
                f"{len(c['recompilations'])} recompilation(s), {len(c['fallbacks'])} eager fallback(s)"
            )
            for b in c["graph_breaks"][:5]:
                lines.append(f"    - break at {b['site']}: {b['reason'].splitlines()[0][:100]}")
        for m in d["memory"]:
            lines.append(
                f"  memory {m['label']:<9} peak {fmt_bytes(m['peak_allocated'])} allocated, "
                f"{fmt_bytes(m['peak_reserved'])} reserved of {fmt_bytes(d['capacity_per_core'])}"
            )
        if d["dry_run"]:
            n = sum(v["count"] for v in d["dry_run"]["value_reads"])
            lines.append(f"  dry run          no data; {n} value read(s) got placeholders (listed in the report)")
            lines += [f"  weights absent   {render.absent_text(a)}" for a in d["dry_run"]["absent_weights"]]
        for e in d["estimates"]:
            lines.append(f"  est. {render.est_label(e):<34} {render.est_line(e)}")
            lines += [f"       {label:<34} {text}" for label, text in render.phase_lines(e)]
        return "\n".join(lines)

    def _sections(self) -> list:
        """[(title, text, headers, rows)]: the one layout Markdown and HTML render."""
        d = self.data
        out = []
        parts = render.SECTIONS
        for part in parts:
            out += part(d)
        return out

    def to_markdown(self, images: dict | None = None, note: str | None = None) -> str:
        """Markdown; `images` maps a caption to a file name next to the report; `note` ends it."""
        lines = ["# torch-neuronx readiness report", ""]
        for title, text, headers, rows in self._sections():
            lines += [f"## {title}", ""]
            if text:
                lines += [text, ""]
            if headers and rows:
                lines.append("| " + " | ".join(headers) + " |")
                lines.append("|" + "---|" * len(headers))
                for r in rows:
                    lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
                lines.append("")
        for caption, name in (images or {}).items():
            lines += [f"![{caption}]({name})", ""]
        if note:
            lines += [note, ""]
        return "\n".join(lines)

    def to_html(self, pngs: dict | None = None, note: str | None = None) -> str:
        """One self-contained HTML page; `pngs` maps a caption to PNG bytes (embedded); `note` ends it."""
        e = html.escape
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><title>torch-neuronx readiness report</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}</style></head><body>",
            "<h1>torch-neuronx readiness report</h1>",
        ]
        for title, text, headers, rows in self._sections():
            parts.append(f"<h2>{e(title)}</h2>")
            if text:
                for para in text.split("\n\n"):
                    para = e(para).replace("**", "")
                    if para.startswith("- "):
                        parts.append("<ul>" + "".join(f"<li>{x[2:]}</li>" for x in para.split("\n")) + "</ul>")
                    else:
                        parts.append(f"<p>{para}</p>")
            if headers and rows:
                parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
                for r in rows:
                    parts.append(
                        "<tr>" + "".join(f"<td>{e(str(x)).replace('&lt;br&gt;', '<br>')}</td>" for x in r) + "</tr>"
                    )
                parts.append("</table>")
        for caption, png in (pngs or {}).items():
            parts.append(
                f"<h2>{e(caption)}</h2><img alt='{e(caption)}' "
                f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
            )
        if note:
            parts.append(f"<p>{render.code_spans(e(note))}</p>")
        parts.append("</body></html>")
        return "\n".join(parts)

    def pictures(self) -> dict:
        """{caption: PNG bytes}: memory over time per core, estimated time per op.

        Empty, with one warning per process, when matplotlib is not installed.
        """
        from .. import _plots

        if not _plots.available():
            render.warn_no_pictures()
            return {}
        out = {"Memory over time": _plots.memory_png(self.data["memory"], self.data["capacity_per_core"])}
        timed = [e for e in self.data["estimates"] if not e["missing"]]
        if timed:
            out["Estimated time per op"] = _plots.ops_png(timed)
        return out

    def save(self, directory: str) -> dict:
        """Write report.json, report.md, report.html and the PNGs (when matplotlib is installed); return their paths."""
        from .. import _plots

        os.makedirs(directory, exist_ok=True)
        pngs = self.pictures()
        names = {caption: render.PICTURE_FILES[caption] for caption in pngs}
        note = None if pngs else _plots.MISSING
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
