"""The readiness report: built from the ranks' recordings, rendered as text, Markdown, HTML, JSON."""

from __future__ import annotations

import base64
import collections
import html
import json
import os
import re
import warnings

from neuronsim import hardware as hw

from . import _estimate

# Chips estimated besides the target instance's own, which comes first.
_CHIPS_ESTIMATED = ("trn2", "trn3")


def _fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _is_oom(error) -> bool:
    return bool(error) and ("OutOfMemoryError" in error or "out of memory" in error.lower())


class Report:
    """What a run on the simulator says about running it on Trainium.

    ``verdict`` is one line; ``data`` holds everything (as saved in report.json);
    ``summary()``, ``to_markdown()``, ``to_html()`` render it; ``save(dir)`` writes all.
    """

    def __init__(
        self,
        raws: list,
        instance: str | None = None,
        lnc: int | None = None,
        capacity: int | None = None,
        command: str | None = None,
        absent_weights: list | None = None,
    ):
        raws = sorted(raws, key=lambda r: r["rank"])
        if not raws:
            raise ValueError("no rank wrote a recording: the script did not start")
        inst = hw.instance(instance or raws[0]["instance_type"])
        # The simulator's LNC stands unless the target cannot run it (trn1 has LNC=1 only).
        recorded = int(raws[0]["lnc"])
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
            **_ranks_run(raws),
            "steps": raws[0]["steps"],
            "wall_seconds": max(r["wall_seconds"] for r in raws),
            "errors": {r["rank"]: r["error"] for r in raws if r["error"]},
            "collector_errors": {r["rank"]: r["collector_errors"] for r in raws if r["collector_errors"]},
        }
        d["fallbacks"] = _merge_fallbacks(raws)
        d["compile"] = _merge_compile(raws)
        d["memory"] = _memory(raws, cap)
        d["memory_per_rank"] = _memory_per_rank(raws)
        d["dry_run"] = _merge_dry_run(raws)
        if d["dry_run"] is not None:
            d["dry_run"]["absent_weights"] = list(absent_weights or [])
        d["fit"] = _fit(d["memory"], cap)
        d["collectives"] = _collectives(raws)
        prec = raws[0].get("fp32_precision", "highest")
        d["estimates"] = _chip_estimates(raws, inst, lnc, prec)
        d["assumptions"] = list(_estimate.ASSUMPTIONS)
        d["verdict"] = _verdict(d)
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
            f"  target           {d['instance_type']}, LNC={d['lnc']}, {_ranks_phrase(d)}, "
            f"{d['steps']} optimizer step(s) seen"
        )
        if d["ranks_not_run"]:
            lines.append(f"  not run          {_not_run_sentence(d)}")
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
                f"  memory {m['label']:<9} peak {_fmt_bytes(m['peak_allocated'])} allocated, "
                f"{_fmt_bytes(m['peak_reserved'])} reserved of {_fmt_bytes(d['capacity_per_core'])}"
            )
        if d["dry_run"]:
            n = sum(v["count"] for v in d["dry_run"]["value_reads"])
            lines.append(f"  dry run          no data; {n} value read(s) got placeholders (listed in the report)")
            lines += [f"  weights absent   {_absent_text(a)}" for a in d["dry_run"]["absent_weights"]]
        for e in d["estimates"]:
            lines.append(f"  est. {_est_label(e):<34} {_est_line(e)}")
            lines += [f"       {label:<34} {text}" for label, text in _phase_lines(e)]
        return "\n".join(lines)

    def _sections(self) -> list:
        """[(title, text, headers, rows)]: the one layout Markdown and HTML render."""
        d = self.data
        out = []
        parts = (_summary, _dry_run, _fallbacks, _compile, _memory_sections, _collective_section, _estimates, _phases)
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
            parts.append(f"<p>{_code_spans(e(note))}</p>")
        parts.append("</body></html>")
        return "\n".join(parts)

    def pictures(self) -> dict:
        """{caption: PNG bytes}: memory over time per core, estimated time per op.

        Empty, with one warning per process, when matplotlib is not installed.
        """
        from . import _plots

        if not _plots.available():
            _warn_no_pictures()
            return {}
        out = {"Memory over time": _plots.memory_png(self.data["memory"], self.data["capacity_per_core"])}
        timed = [e for e in self.data["estimates"] if not e["missing"]]
        if timed:
            out["Estimated time per op"] = _plots.ops_png(timed)
        return out

    def save(self, directory: str) -> dict:
        """Write report.json, report.md, report.html and the PNGs (when matplotlib is installed); return their paths."""
        from . import _plots

        os.makedirs(directory, exist_ok=True)
        pngs = self.pictures()
        names = {caption: _PICTURE_FILES[caption] for caption in pngs}
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


# -- building blocks -----------------------------------------------------------
# The report's sections: each returns [(title, text, headers, rows)].
def _summary(d) -> list:
    """The verdict, the target and how the ranks ended."""
    out = []
    intro = (
        f"Verdict: **{d['verdict']}**\n\nTarget {d['instance_type']} at LNC={d['lnc']} "
        f"({_fmt_bytes(d['capacity_per_core'])} HBM per logical core"
        f"{', capacity set by the user' if d['capacity_is_override'] else ''}); "
        f"{_ranks_phrase(d)}; {d['steps']} optimizer step(s) seen; "
        f"{d['wall_seconds']:.1f} s on the simulator."
    )
    if d["ranks_not_run"]:
        intro += f"\n\n**Not run:** {_not_run_sentence(d)}"
    if d["command"]:
        intro += f"\n\nCommand: `{d['command']}`"
    for rank, err in d["errors"].items():
        intro += f"\n\nRank {rank} stopped with: `{err.splitlines()[0][:300]}`"
    for rank, errs in d["collector_errors"].items():
        intro += (
            f"\n\nRank {rank}: {sum(errs.values())} op call(s) could not be recorded and are missing "
            f"from this report, e.g. `{next(iter(errs))[:300]}`"
        )
    out.append(("Summary", intro, None, None))
    return out


def _ranks_run(raws) -> dict:
    """The job's world size and the ranks of it that have no recording here (not run)."""
    world = max(int(r.get("world_size") or 1) for r in raws)
    ran = {int(r["rank"]) for r in raws}
    return {"world_size": world, "ranks_run": sorted(ran), "ranks_not_run": sorted(set(range(world)) - ran)}


def _ranks_phrase(d) -> str:
    if d["ranks_not_run"]:
        return f"{d['ranks']} of {d['world_size']} ranks run ({_ranges(d['ranks_run'])})"
    return f"{d['ranks']} rank(s)"


def _not_run_sentence(d) -> str:
    n = len(d["ranks_not_run"])
    return (
        f"rank{'s' if n > 1 else ''} {_ranges(d['ranks_not_run'])} of the job's {d['world_size']} "
        f"{'were' if n > 1 else 'was'} not run: {'their' if n > 1 else 'its'} memory, ops, collectives and "
        "time are unknown. Every figure in this report is of the ranks run only; nothing is extrapolated "
        "to the others."
    )


def _dry_run(d) -> list:
    """What a dry run read, assumed and could not know."""
    dr = d.get("dry_run")
    if not dr:
        return []
    text = (
        "This is a **dry run**: the script ran at its real size with no data. Every tensor had its "
        "real shape, dtype and device and no memory behind it; the device allocator counted every "
        "storage as a real run allocates it. What it cannot know:\n\n" + "\n".join(f"- {c}" for c in CANNOT_KNOW)
    )
    absent = dr.get("absent_weights") or []
    if absent:
        text += "\n\nWeights absent (the run loaded header-only weights built from the config in their place):\n\n"
        text += "\n".join(f"- {_absent_text(a)}" for a in absent)
    out = [("Dry run", text, None, None)]
    rows = [[v["site"], v["kind"], v["placeholder"], v["count"]] for v in dr["value_reads"]]
    rows += [[a["site"], f"{a['check']} check", a["value"], a["count"]] for a in dr["assumed"]]
    out.append(
        (
            "Values the dry run did not have",
            "None were read."
            if not rows
            else "Each read got the placeholder shown; finiteness checks were answered "
            "as if every value were finite.",
            ["read at", "kind", "placeholder", "reads"],
            rows or None,
        )
    )
    return out


def _absent_text(a: dict) -> str:
    return (
        f"{a['path']}: config.json and no weight files; loaded as {a['class']} with {a['dtype']} weights "
        f"({_fmt_bytes(a['bytes'])}; {'dtype from the config' if a['dtype_from_config'] else 'the config names no dtype'})"
    )


def _fallbacks(d) -> list:
    """Ops that would fall back to the host CPU."""
    out = []
    rows = [
        [
            f["op"],
            f["dtype"],
            f["count"],
            f["reason"],
            "<br>".join(f"{s} (x{n})" for s, n in list(f["sites"].items())[:5]),
        ]
        for f in d["fallbacks"]
    ]
    out.append(
        (
            "Ops that would not be native on Trainium",
            "None: every op the script ran on `neuron` has a Trainium lowering."
            if not rows
            else "They run on the host CPU on Trainium, with a device-host round trip per call.",
            ["op", "dtype", "calls", "reason", "issued at"],
            rows,
        )
    )
    return out


def _compile(d) -> list:
    """torch.compile: graphs, breaks, recompilations, eager fallbacks."""
    out = []
    c = d["compile"]
    text = (
        f"{len(c['graphs'])} graph(s) compiled by backend \"neuron\", {c['graph_break_total']} graph "
        f"break(s), {len(c['recompilations'])} recompilation(s), {len(c['fallbacks'])} graph(s) "
        f"run eagerly after a compile error."
    )
    if c["dynamic_shapes"]:
        text += (
            f" Dynamic shapes found in {len(c['dynamic_shapes'])} graph(s): each new shape is "
            "compiled separately on Neuron (pad inputs to a few fixed sizes)."
        )
    if c["recompiles_every_step"]:
        text += " Recompiles in every step after the first."
    if not c["graphs"] and not c["graph_breaks"]:
        text = "torch.compile was not used."
    out.append(("torch.compile", text, None, None))
    if c["graph_breaks"]:
        out.append(
            (
                "Graph breaks",
                None,
                ["reason", "where", "count"],
                [[b["reason"].splitlines()[0][:200], b["site"], b["count"]] for b in c["graph_breaks"]],
            )
        )
    if c["recompilations"]:
        out.append(
            (
                "Recompilations",
                None,
                ["graph", "reason", "shapes"],
                [[r["graph"], r["reason"].splitlines()[0][:200], str(r["shapes"])[:200]] for r in c["recompilations"]],
            )
        )
    if c["fallbacks"]:
        out.append(
            (
                "Graphs run eagerly",
                None,
                ["graph", "error"],
                [[f["graph"], f["error"].splitlines()[0][:200]] for f in c["fallbacks"]],
            )
        )
    return out


def _memory_sections(d) -> list:
    """Memory per core, its breakdown, the largest tensors, the fit elsewhere."""
    out = []
    rows = [
        [
            m["label"],
            _fmt_bytes(m["peak_allocated"]),
            _fmt_bytes(m["peak_reserved"]),
            _fmt_bytes(d["capacity_per_core"]),
            f"{m['peak_allocated'] / d['capacity_per_core']:.1%}",
            "yes" if m["fits"] else "NO",
        ]
        for m in d["memory"]
    ]
    out.append(
        (
            "Memory per logical NeuronCore",
            "Ranks with identical memory in every figure below share a row." if d["ranks"] > 1 else None,
            ["core", "peak allocated", "peak reserved", "capacity", "allocated/capacity", "fits"],
            rows,
        )
    )
    kinds = [m for m in d["memory"] if m.get("breakdown")]
    if kinds:
        from ._dryrun import CATEGORIES

        out.append(
            (
                "What the memory at the peak holds",
                "Live storages at the largest usage seen (within 2% of the peak), by what holds them.",
                ["core", "at"] + list(CATEGORIES),
                [
                    [m["label"], _fmt_bytes(m["top_tensors_at"])] + [_fmt_bytes(m["breakdown"][c]) for c in CATEGORIES]
                    for m in kinds
                ],
            )
        )
    for m in d["memory"]:
        if m["top_tensors"]:
            out.append(
                (
                    f"Largest live tensors at the peak, {m['label']}",
                    f"Sampled at {_fmt_bytes(m['top_tensors_at'])} allocated "
                    f"(peak {_fmt_bytes(m['peak_allocated'])}).",
                    ["bytes", "shape", "dtype", "made by", "holds"],
                    [
                        [_fmt_bytes(t["bytes"]), str(tuple(t["shape"])), t["dtype"], t["op"], t.get("kind", "-")]
                        for t in m["top_tensors"]
                    ],
                )
            )
    out.append(
        (
            "Would it fit elsewhere",
            "Same per-core memory (same sharding) on each configuration.",
            ["chip", "LNC", "HBM per logical core", "fits"],
            [[f["chip"], f["lnc"], _fmt_bytes(f["capacity"]), f["fits"]] for f in d["fit"]],
        )
    )
    return out


def _collective_section(d) -> list:
    """Collectives per step."""
    out = []
    rows = [
        [k["kind"], k["dtype"], _fmt_bytes(k["bytes"]), k["group_size"], f"{k['calls_per_step']:g}"]
        for k in d["collectives"]
    ]
    scope = (
        "Per step after the first (the first also sets up)."
        if d["steps"] >= 2
        else ("Per step." if d["steps"] else "The whole run (no optimizer step seen).")
    )
    out.append(
        (
            "Collectives per step",
            "None." if not rows else scope,
            ["kind", "dtype", "bytes", "group size", "calls per step"],
            rows or None,
        )
    )
    return out


def _estimates(d) -> list:
    """Estimated time, per-op breakdown and the model's assumptions."""
    rows = []
    for e in d["estimates"]:
        where = [e["instance"] + (" (target)" if e["target"] else ""), e["chip"], e["lnc"]]
        if e["missing"]:
            rows.append(where + [e["missing"]] + ["-"] * 6)
            continue
        shares = [f"{e['shares'][k]:.0%}" for k in _SHARES]
        rows.append(where + [_fmt_s(e["step_seconds"]), _fmt_mfu(e)] + shares + [e["dominant"]])
    ests = [e for e in d["estimates"] if not e["missing"]]
    scope = "whole run (no optimizer step seen)" if ests and not ests[0]["per_step"] else "median optimizer step"
    out = [
        (
            "Estimated time on Trainium",
            f"Per {scope}, slowest rank{' of the ranks run' if d['ranks_not_run'] else ''}; the target "
            "instance first. MFU: the step's matmul-like FLOPs over "
            f"all{' run' if d['ranks_not_run'] else ''} ranks' Tensor Engine dense peak for their main dtype "
            "in that time. The shares split the step's time between the model's terms.",
            ["instance", "chip", "LNC", "time", "MFU"] + list(_SHARES) + ["dominated by"],
            rows,
        )
    ]
    if ests:
        out += _breakdown_sections(d, ests)
    return out


def _breakdown_sections(d, ests) -> list:
    """The per-op breakdown and the figures and assumptions behind the estimates in `ests`."""
    keyed = [{(o["op"], o["dtype"]): o for o in e["ops"]} for e in ests]
    rows = []
    for o in ests[0]["ops"][:20]:
        k = (o["op"], o["dtype"])
        rows.append(
            [o["op"], o["dtype"], o["count"], f"{o['flops']:.3g}", _fmt_bytes(o["bytes"])]
            + [_fmt_s(kd[k]["seconds"]) if k in kd else "-" for kd in keyed]
            + [
                "compute"
                if o["compute_bound_calls"] * 2 >= o["count"]
                else ("fixed" if o["fixed_seconds"] * 2 >= o["seconds"] else "memory")
            ]
        )
    out = [
        (
            "Per-op breakdown",
            f"Top {len(rows)} ops by estimated time on {ests[0]['chip']}.",
            ["op", "dtype", "calls", "FLOPs", "bytes"] + [f"{e['chip']}" for e in ests] + ["bound"],
            rows,
        )
    ]
    fig = ests[0]["figures"]
    figs = ", ".join(
        f"{e['chip']}: Tensor Engine {e['figures']['tensor_flops']['bfloat16'] / 1e12:.0f} TFLOPS bf16, "
        f"memory {e['figures']['memory_bytes_per_s'] / 1e9:.0f} GB/s, NeuronLink one way "
        f"{e['figures']['link_bytes_per_s'] / 1e9:.0f} GB/s per core"
        for e in ests
    )
    out.append(
        (
            "Model assumptions",
            f"Per logical core ({figs}); DMA fixed cost {fig['dma_fixed_s'] * 1e6:.1f} us.\n\n"
            + "\n".join(f"- {a}" for a in d["assumptions"]),
            None,
            None,
        )
    )
    return out


_SHARES = ("compute", "memory", "fixed", "collectives")


def _fmt_mfu(e) -> str:
    return "-" if e["mfu"] is None else f"{e['mfu']:.1%} ({e['mfu_dtype']})"


def _est_label(e) -> str:
    return f"{e['instance']} {e['chip']} LNC={e['lnc']}" + (" (target)" if e["target"] else "")


def _est_line(e) -> str:
    """One estimate in the summary: time, MFU and the terms' shares, largest first."""
    if e["missing"]:
        return e["missing"]
    unit = "per step" if e["per_step"] else "whole run"
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(e["shares"].items(), key=lambda kv: -kv[1]))
    mfu = "MFU -" if e["mfu"] is None else f"MFU {e['mfu']:.1%}"
    return f"{_fmt_s(e['step_seconds'])} {unit}, {mfu}; {shares}"


_PHASE_LABELS = {"prefill": "prefill (time to first token)", "decode": "decode step (time per output token)"}


def _phase_text(p: dict) -> str:
    mfu = "MFU -" if p["mfu"] is None else f"MFU {p['mfu']:.1%}"
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(p["term_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
    return f"{_fmt_s(p['seconds'])} (median of {p['count']}, {p['tokens']} token(s)), {mfu}; {shares}"


def _phase_lines(e) -> list:
    """[(label, text)] of an estimate's generation phases, for the summary."""
    ph = e.get("phases")
    if not ph:
        return []
    if ph.get("missing"):
        return [("generation phases", f"not estimated: {ph['missing']}")]
    return [(_PHASE_LABELS[k], _phase_text(p)) for k, p in ph.items() if p]


def _phases(d) -> list:
    """The estimate of each phase of a generation (prefill, decode step), per chip."""
    rows = []
    for e in d["estimates"]:
        ph = e.get("phases")
        if e["missing"] or not ph or ph.get("missing"):
            continue
        for k, p in ph.items():
            if p:
                shares = [f"{p['term_shares'][t]:.0%}" for t in p["term_shares"]]
                rows.append([e["instance"], e["chip"], e["lnc"], _PHASE_LABELS[k], p["tokens"], p["count"],
                             _fmt_s(p["seconds"]), _fmt_mfu(p)] + shares + [p["dominant"]])  # fmt: skip
    if not rows:
        return []
    terms = list(next(p for e in d["estimates"] for p in (e.get("phases") or {}).values() if p)["term_shares"])
    text = (
        "Forwards of the top-level model while no optimizer step ran: a prefill is the first forward of a "
        "generation (time to first token), a decode step a later forward with the KV cache, one token per "
        "sequence (time per output token). Each is the median of its kind, slowest rank, with the sampling "
        "that follows it; the shares split its time between the model's terms."
    )
    return [
        (
            "Estimated generation phases",
            text,
            ["instance", "chip", "LNC", "phase", "tokens", "forwards", "time", "MFU"] + terms + ["dominated by"],
            rows,
        )
    ]


def _counterpart(inst, chip: str) -> str:
    """The instance of `chip` shaped like `inst` (as many chips), else its first one."""
    same_chip = [i for i in hw.INSTANCES.values() if i.chip == chip]
    return next((i.name for i in same_chip if i.chips == inst.chips), same_chip[0].name)


def _chip_estimates(raws, inst, lnc, prec) -> list:
    """The target instance's chip first, at the target LNC; then the other chips, each on its
    instance shaped like the target, at the same LNC where the chip allows it."""
    out = []
    for chip in [inst.chip] + [c for c in _CHIPS_ESTIMATED if c != inst.chip]:
        target = chip == inst.chip
        allowed = hw.CHIPS[chip].lnc_allowed
        n = lnc if target or lnc in allowed else hw.CHIPS[chip].lnc_default
        name = inst.name if target else _counterpart(inst, chip)
        out.append({**_estimate.estimate(raws, chip, n, prec, instance=name), "target": target})
    return out


_PICTURE_FILES = {"Memory over time": "memory.png", "Estimated time per op": "ops.png"}
_warned_no_pictures = False


def _warn_no_pictures():
    # One run may build several reports (one per `with` block); one warning is enough.
    global _warned_no_pictures
    if _warned_no_pictures:
        return
    _warned_no_pictures = True
    from . import _plots

    warnings.warn(f"torch-neuronx readiness: {_plots.MISSING}", UserWarning, stacklevel=4)


def _code_spans(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _merge_fallbacks(raws) -> list:
    merged: dict = {}
    for r in raws:
        for f in r["fallbacks"]:
            e = merged.setdefault(
                (f["op"], f["dtype"], f["reason"]),
                {"op": f["op"], "dtype": f["dtype"], "reason": f["reason"], "count": 0, "sites": collections.Counter()},
            )
            e["count"] += f["count"]
            e["sites"].update(f["sites"])
    out = sorted(merged.values(), key=lambda e: -e["count"])
    for e in out:
        e["sites"] = dict(e["sites"].most_common())
    return out


def _merge_compile(raws) -> dict:
    c0 = raws[0]["compile"]  # ranks run the same program: rank 0's compile story stands for all
    breaks = collections.Counter()
    for r in raws[:1]:
        for b in r["compile"]["graph_breaks"]:
            breaks[(b["reason"], b["site"])] += b["count"]
    per_step = c0["step_recompilations"]
    dynamic = sorted({r["graph"].rsplit("_s", 1)[0] for r in c0["recompilations"] if "dynamic" in r["reason"]})
    counted = sum(c0.get("graph_break_counts", {}).values())
    return {
        "graphs": c0["graphs"],
        "recompilations": c0["recompilations"],
        "fallbacks": c0["fallbacks"],
        "graph_breaks": [{"reason": r, "site": s, "count": n} for (r, s), n in breaks.most_common()],
        "graph_break_total": max(counted, sum(breaks.values())),
        "graph_break_counts": c0.get("graph_break_counts", {}),
        "dynamic_shapes": dynamic,
        "step_recompilations": per_step,
        "recompiles_every_step": len(per_step) >= 3 and all(n > 0 for n in per_step[1:]),
    }


def _ranges(ranks: list) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}-{r}" if r > start else str(r))
            start = None
    return ", ".join(parts)


def _memory(raws, cap) -> list:
    """One entry per core; ranks whose memory is identical in every figure the report shows
    (peaks, breakdown, largest tensors) share one entry, which lists them."""
    out, classes = [], {}
    for r in raws:
        for core, m in r["memory"].items():
            oom = m["num_ooms"] > 0 or _is_oom(r["error"])
            key = (
                m["peak_allocated"],
                m["peak_reserved"],
                oom,
                tuple(sorted((m.get("breakdown") or {}).items())),
                tuple((t["bytes"], tuple(t["shape"]), t["dtype"], t["op"]) for t in m["top_tensors"]),
            )
            if len(raws) > 1 and key in classes:
                classes[key]["ranks"].append(r["rank"])
                continue
            # What tensors hold must fit; the allocator's cache above that shrinks under pressure.
            e = dict(m, core=core, ranks=[r["rank"]], oom=oom, fits=not oom and m["peak_allocated"] <= cap)
            classes[key] = e
            out.append(e)
    for e in out:
        if len(raws) == 1:
            e["label"] = f"neuron:{e['core']}"
        elif len(e["ranks"]) == 1:
            e["label"] = f"rank {e['ranks'][0]} neuron:{e['core']}"
        else:
            e["label"] = f"ranks {_ranges(e['ranks'])}"
    return out


def _memory_per_rank(raws) -> list:
    """Every rank's peaks (the report's tables group identical ranks)."""
    return [
        {
            "rank": r["rank"],
            "core": int(core),
            "peak_allocated": m["peak_allocated"],
            "peak_reserved": m["peak_reserved"],
        }
        for r in raws
        for core, m in r["memory"].items()
    ]


def _merge_dry_run(raws) -> dict | None:
    dry = [r.get("dry_run") for r in raws if r.get("dry_run")]
    if not dry:
        return None
    # Ranks run one program; rank 0's reads stand for all, as its compile story does.
    return {
        "value_reads": dry[0]["value_reads"],
        "assumed": dry[0]["assumed"],
    }


CANNOT_KNOW = (
    "values: losses, gradient norms and any other number read from a tensor (each read is listed "
    "with the placeholder the run got);",
    "shapes that depend on values (nonzero, masked_select, unique, ...): the run stops at the first one;",
    "numerics: NaN, overflow, loss of precision;",
    "host time: data loading, tokenization and Python overhead, which the step-time estimate does not include;",
    "memory the real device's kernels take for their own scratch buffers (not part of any tensor).",
)


def _fit(memory, cap) -> list:
    peak_alloc = max([m["peak_allocated"] for m in memory] + [0])
    peak_res = max([m["peak_reserved"] for m in memory] + [0])
    oom = any(m["oom"] for m in memory)
    rows = []
    for name, chip in hw.CHIPS.items():
        for n in chip.lnc_allowed:
            capacity = chip.per_core(n)["hbm_bytes"]
            if oom and capacity <= cap:
                fits = "no (ran out of memory)"
            elif peak_res <= capacity:
                fits = "yes"
            elif peak_alloc <= capacity:
                fits = "yes, with a smaller allocator cache"
            else:
                fits = "no"
            rows.append({"chip": name, "lnc": n, "capacity": capacity, "fits": fits})
    return rows


def _collectives(raws) -> list:
    r = raws[0]
    # The steady state: steps after the first (which also holds setup, e.g. DDP's broadcasts).
    buckets = r["collectives"][1 : r["steps"]] if r["steps"] >= 2 else r["collectives"][: max(r["steps"], 1)]
    if not r["steps"]:
        buckets = r["collectives"]
    n = max(len(buckets), 1) if r["steps"] else 1
    total = collections.Counter()
    for b in buckets:
        for kind, dtype, nbytes, size, count in b:
            total[(kind, dtype, nbytes, size)] += count
    return [
        {"kind": k, "dtype": d, "bytes": b, "group_size": s, "calls_per_step": c / n}
        for (k, d, b, s), c in sorted(total.items(), key=lambda kv: -kv[0][2] * kv[1])
    ]


def _verdict(d) -> str:
    problems = []
    for rank, err in d["errors"].items():
        if not _is_oom(err):
            problems.append(f"failed on rank {rank}: {err.splitlines()[0][:160]}")
            break
    if not all(m["fits"] for m in d["memory"]):
        worst = max(d["memory"], key=lambda m: (m["oom"], m["peak_allocated"]))
        why = "ran out of memory" if worst["oom"] else f"peak {_fmt_bytes(worst['peak_allocated'])} allocated"
        problems.append(
            f"will not fit: {why} on {worst['label']}, capacity "
            f"{_fmt_bytes(d['capacity_per_core'])} per core on {d['instance_type']} at LNC={d['lnc']}"
        )
    if d["compile"]["recompiles_every_step"]:
        problems.append("recompiles every step")
    if d["fallbacks"]:
        problems.append(
            f"runs with {len(d['fallbacks'])} fallback{'s' if len(d['fallbacks']) > 1 else ''} "
            f"({sum(f['count'] for f in d['fallbacks'])} calls on CPU)"
        )
    verdict = "; ".join(problems) if problems else "runs natively"
    if d["ranks_not_run"]:
        verdict += f" (on the ranks run, {_ranges(d['ranks_run'])} of {d['world_size']}; the others unknown)"
    return verdict
