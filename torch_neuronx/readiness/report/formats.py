"""The output formats of a report's data: the terminal summary, Markdown, one HTML page."""

from __future__ import annotations

import base64
import html

from . import render
from .text import fmt_bytes


def sections(d) -> list:
    """[(title, text, headers, rows)]: the one layout Markdown and HTML render."""
    out = []
    for part in render.SECTIONS:
        out += part(d)
    return out


def summary(d) -> str:
    """The verdict and the key figures, a line each, for the terminal."""
    lines = [f"torch-neuronx readiness{' (dry run)' if d['dry_run'] else ''}: {d['verdict']}"]
    lines.append(
        f"  target           {d['instance_type']}, LNC={d['lnc']}, {render.ranks_phrase(d)}, "
        f"{d['steps']} optimizer step(s) seen"
    )
    if d.get("classes"):
        c = d["classes"]
        unproven = [k for k in c["classes"] if not k["proven"]]
        lines.append(
            f"  rank classes     {len(c['classes'])} classes, {len(c['runs'])} of {d['world_size']} ranks run "
            f"({c['cost']['wall_seconds']:.0f} s); "
            + (f"{len(unproven)} not proven: {unproven[0]['why'][:200]}" if unproven else "every class proven")
        )
    if d["ranks_not_run"]:
        lines.append(f"  not run          {render.not_run_sentence(d)}")
    for f in (d.get("across_ranks") or {}).get("findings", [])[:5]:
        lines.append(f"  across ranks     {f['kind']}: {f['message'][:300]}")
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
        lines += [
            f"  {'saved no data' if f.get('written', True) else 'not written':<16} {render.saved_text(f)}"
            for f in d["dry_run"].get("saved_without_data", [])
        ]
    for e in d["estimates"]:
        lines.append(f"  est. {render.est_label(e):<34} {render.est_line(e)}")
        lines += [f"       {label:<34} {text}" for label, text in render.phase_lines(e)]
    lines += [f"  known error      {line}" for line in render.known_errors(d)]
    return "\n".join(lines)


def markdown(d, images: dict | None = None, note: str | None = None) -> str:
    """Markdown; `images` maps a caption to a file name next to the report; `note` ends it."""
    lines = ["# torch-neuronx readiness report", ""]
    for title, text, headers, rows in sections(d):
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


def html_page(d, pngs: dict | None = None, note: str | None = None) -> str:
    """One self-contained HTML page; `pngs` maps a caption to PNG bytes (embedded); `note` ends it."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>torch-neuronx readiness report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}</style></head><body>",
        "<h1>torch-neuronx readiness report</h1>",
    ]
    for title, text, headers, rows in sections(d):
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
