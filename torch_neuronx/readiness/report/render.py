"""Laying out the report's data: the sections Markdown and HTML share, and the summary's phrases."""

from __future__ import annotations

import re
import warnings

from ..estimate import known_error as _known_error
from ..estimate.results import SHARES
from ..record.recording import MemoryCategory
from .text import fmt_bytes, fmt_s, ranges


# -- building blocks -----------------------------------------------------------
# The report's sections: each returns [(title, text, headers, rows)].
def _summary(d) -> list:
    """The verdict, the target and how the ranks ended."""
    out = []
    intro = (
        f"Verdict: **{d['verdict']}**\n\nTarget {d['instance_type']} at LNC={d['lnc']} "
        f"({fmt_bytes(d['capacity_per_core'])} HBM per logical core"
        f"{', capacity set by the user' if d['capacity_is_override'] else ''}); "
        f"{ranks_phrase(d)}; {d['steps']} optimizer step(s) seen; "
        f"{d['wall_seconds']:.1f} s on the simulator."
    )
    if d["ranks_not_run"]:
        intro += f"\n\n**Not run:** {not_run_sentence(d)}"
    if d["command"]:
        intro += f"\n\nCommand: `{d['command']}`"
    for rank, err in d["errors"].items():
        intro += f"\n\nRank {rank} stopped with: `{err.splitlines()[0][:300]}`"
    for rank, errs in d["recorder_errors"].items():
        intro += (
            f"\n\nRank {rank}: {sum(errs.values())} op call(s) could not be recorded and are missing "
            f"from this report, e.g. `{next(iter(errs))[:300]}`"
        )
    out.append(("Summary", intro, None, None))
    return out


def ranks_phrase(d) -> str:
    if d.get("classes") and len(d["ranks_run"]) < d["world_size"]:
        answered = d["world_size"] - len(d["ranks_not_run"])
        return f"{d['world_size']} ranks ({d['ranks']} run; {answered} answered, run or by their class)"
    if d["ranks_not_run"]:
        return f"{d['ranks']} of {d['world_size']} ranks run ({ranges(d['ranks_run'])})"
    return f"{d['ranks']} rank(s)"


def not_run_sentence(d) -> str:
    n = len(d["ranks_not_run"])
    return (
        f"rank{'s' if n > 1 else ''} {ranges(d['ranks_not_run'])} of the job's {d['world_size']} "
        f"{'were' if n > 1 else 'was'} not run: {'their' if n > 1 else 'its'} memory, ops, collectives and "
        "time are unknown. Every figure in this report is of the ranks run only; nothing is extrapolated "
        "to the others."
    )


def _rank_classes(d) -> list:
    """The rank classes of a dry run by classes: who ran, who each answers for, and how it was proven."""
    c = d.get("classes")
    if not c:
        return []
    mesh = " x ".join(f"{m['name']} {m['size']}" for m in c["mesh"])
    cost = c["cost"]
    text = (
        f"The job's {d['world_size']} ranks ({mesh}) in {len(c['classes'])} classes of ranks that do the same "
        f"work; {len(c['runs'])} ranks were run: each class's representative, and witnesses at the far end of "
        "every other mesh dimension, whose collectives, compiled graphs, op counts and peak memory must equal "
        "the representative's. A rank not run has its class's answers. This dry run took "
        f"{cost['wall_seconds']:.0f} s and at most {fmt_bytes(cost['host_peak_bytes'])} of host memory. "
        "To run every rank instead: `--ranks all`."
    )
    rows = [
        [ranges(k["ranks"]), k["size"], k["rep"], ", ".join(map(str, k["witnesses"])) or "-",
         "yes" if k["proven"] else "NO",
         k["why"] + (f"; its class was split: {k['split_because']}" if k.get("split_because") else "")]
        for k in c["classes"]
    ]  # fmt: skip
    return [("Rank classes", text, ["ranks", "size", "representative", "witnesses", "proven", "how"], rows)]


def _dry_run(d) -> list:
    """What a dry run read, assumed and could not know."""
    dr = d.get("dry_run")
    if not dr:
        return []
    compiled = bool((d.get("compile") or {}).get("graphs"))  # by backend "neuron" or Inductor, without code
    cannot = CANNOT_KNOW[:-1] + (UNFUSED,) * compiled + CANNOT_KNOW[-1:]
    text = (
        "This is a **dry run**: the script ran at its real size with no data. Every tensor had its "
        "real shape, dtype and device and no memory behind it; the device allocator counted every "
        "storage as a real run allocates it. What it cannot know:\n\n" + "\n".join(f"- {c}" for c in cannot)
    )
    absent = dr.get("absent_weights") or []
    if absent:
        text += "\n\nWeights absent (the run loaded header-only weights built from the config in their place, where it could):\n\n"
        text += "\n".join(f"- {absent_text(a)}" for a in absent)
    saved = dr.get("saved_without_data") or []
    if saved:
        text += "\n\nFiles saved without data (" + "; ".join(_saved_kinds(saved)) + "):\n\n"
        text += "\n".join(f"- {saved_text(f)}" for f in saved)
    out = [("Dry run", text, None, None)]
    rows = [[v["site"], v["kind"], v["placeholder"], v["count"]] for v in dr["value_reads"]]
    rows += [
        [a["site"], f"{a['check']} check" if a["check"] == "finite" else f"{a['check']} result", a["value"], a["count"]]
        for a in dr["assumed"]
    ]
    out.append(
        (
            "Values the dry run did not have",
            "None were read."
            if not rows
            else "Each read got the placeholder shown; finiteness checks were answered "
            "as if every value were finite; each collective's result, as if every rank held this rank's values.",
            ["read at", "kind", "placeholder", "reads"],
            rows or None,
        )
    )
    return out


def _saved_kinds(saved: list) -> list:
    """What the listed files are: header-only safetensors files, torch.save's files not written."""
    kinds = []
    if any(f.get("written", True) for f in saved):
        kinds.append(
            "safetensors files with every tensor's name, dtype and shape, as the real run writes them, "
            "and no data: loading one gives zeros"
        )
    if not all(f.get("written", True) for f in saved):
        kinds.append(
            "torch.save's files are not written in a dry run: a pickle holds the data, which a dry run does "
            "not have; the run went on, and a torch.load of one would stop it there"
        )
    return kinds


def saved_text(f: dict) -> str:
    if not f.get("written", True):
        return (
            f"{f['path']}: not written (torch.save's files are not written in a dry run: a pickle holds the "
            f"data); {f['tensors']} tensor(s), {fmt_bytes(f['bytes'])} of data, saved at {f['site']}"
        )
    return f"{f['path']}: {f['tensors']} tensor(s), {fmt_bytes(f['bytes'])} of data not written (saved at {f['site']})"


def absent_text(a: dict) -> str:
    what = a.get("absent", "config.json and no weight files")
    if a.get("class") is None:  # no stand-in: the script got its own directory
        return f"{a['path']}: {what}; no stand-in ({a['reason']})"
    source = a.get("dtype_from", "the config" if a["dtype_from_config"] else None)
    return (
        f"{a['path']}: {what}; loaded as {a['class']} with {a['dtype']} weights "
        f"({fmt_bytes(a['bytes'])}; {f'dtype from {source}' if source else 'the config names no dtype'})"
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
            fmt_bytes(m["peak_allocated"]),
            fmt_bytes(m["peak_reserved"]),
            fmt_bytes(d["capacity_per_core"]),
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
        out.append(
            (
                "What the memory at the peak holds",
                "Live storages at the largest usage seen (within 2% of the peak), by what holds them.",
                ["core", "at"] + [c.value for c in MemoryCategory],
                [
                    [m["label"], fmt_bytes(m["top_tensors_at"])]
                    + [fmt_bytes(m["breakdown"][c.value]) for c in MemoryCategory]
                    for m in kinds
                ],
            )
        )
    for m in d["memory"]:
        if m["top_tensors"]:
            out.append(
                (
                    f"Largest live tensors at the peak, {m['label']}",
                    f"Sampled at {fmt_bytes(m['top_tensors_at'])} allocated "
                    f"(peak {fmt_bytes(m['peak_allocated'])}).",
                    ["bytes", "shape", "dtype", "made by", "holds"],
                    [
                        [fmt_bytes(t["bytes"]), str(tuple(t["shape"])), t["dtype"], t["op"], t.get("kind", "-")]
                        for t in m["top_tensors"]
                    ],
                )
            )
    out.append(
        (
            "Would it fit elsewhere",
            "Same per-core memory (same sharding) on each configuration.",
            ["chip", "LNC", "HBM per logical core", "fits"],
            [[f["chip"], f["lnc"], fmt_bytes(f["capacity"]), f["fits"]] for f in d["fit"]],
        )
    )
    return out


def _across_ranks(d) -> list:
    """Where the ranks' collectives would hang or disagree."""
    a = d.get("across_ranks") or {}
    if not a.get("findings") and len(a.get("ranks_compared", [])) < 2:
        return []
    rows = [[f["kind"], f["group"], f["message"]] for f in a["findings"]]
    text = (
        f"The collectives of {len(a['ranks_compared'])} rank(s) compared in each of {len(a['groups'])} process "
        "group(s): members must issue the same collectives in the same order (op, dtype, reduce op, and the "
        "shapes of those whose inputs are alike on every rank), and each send must meet a receive. "
        + ("They agree." if not rows else "The first place each group differs:")
    )
    return [("Collectives across ranks", text, ["finding", "group", "what"] if rows else None, rows or None)]


def _collective_section(d) -> list:
    """Collectives per step."""
    out = []
    rows = [
        [k["kind"], k["dtype"], fmt_bytes(k["bytes"]), k["group_size"], f"{k['calls_per_step']:g}"]
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
            rows.append(where + [e["missing"]] + ["-"] * 7)
            continue
        shares = [f"{e['shares'][k]:.0%}" for k in SHARES]
        hidden = fmt_s(e["hidden_seconds"]) if e.get("hidden_seconds") else "-"
        rows.append(where + [fmt_s(e["step_seconds"]), _fmt_mfu(e)] + shares + [hidden, e["dominant"]])
    ests = [e for e in d["estimates"] if not e["missing"]]
    if ests and not ests[0]["per_step"]:
        scope = "whole run (no optimizer step seen)"
    elif d["steps"] > 1:
        scope = "median optimizer step after the first (which also builds the model and the optimizer's state)"
    else:
        scope = "median optimizer step"
    out = [
        (
            "Estimated time on Trainium",
            f"Per {scope}, slowest rank{' of the ranks run' if d['ranks_not_run'] else ''}; the target "
            "instance first. MFU: the step's matmul-like FLOPs over "
            f"all{' run' if d['ranks_not_run'] else ''} ranks' Tensor Engine dense peak for their main dtype "
            "in that time. The shares split the step's work between the model's terms; collectives "
            "under compute: the part of the asynchronous collectives' time that runs while the compute "
            "engines work, and so is not in the step's time."
            + "".join(
                f" Known error of {_known_error.band(k, _tensor_parallel(d))}"
                + (f": {_known_error.rows_text(k, _tensor_parallel(d))}." if k != "whole run" else ".")
                for k in (_kinds(ests) if ests else [])
            ),
            ["instance", "chip", "LNC", "time", "MFU"] + list(SHARES) + ["collectives under compute", "dominated by"],
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
            [o["op"], o["dtype"], o["count"], f"{o['flops']:.3g}", fmt_bytes(o["bytes"])]
            + [fmt_s(kd[k]["seconds"]) if k in kd else "-" for kd in keyed]
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


def _kinds(ests: list) -> list:
    """The kinds of run the estimates are of, as the known-error table names them."""
    kinds = ["training" if ests[0]["per_step"] else "whole run"]
    phases = ests[0].get("phases") or {}
    return kinds + [k for k in ("prefill", "decode") if phases.get(k)]


def _tensor_parallel(d) -> int:
    """The run's tensor-parallel degree as the known-error table splits training by it: the largest
    group whose collectives a step waits for (tensor and sequence parallelism wait; data
    parallelism's gradient collectives are asynchronous), 1 without one."""
    return max((c["group_size"] for c in d["collectives"] if not c.get("asynchronous")), default=1)


def known_errors(d) -> list:
    """One line per kind of run estimated: how far such estimates have been from AWS's figures."""
    ests = [e for e in d["estimates"] if not e["missing"]]
    return [_known_error.band(k, _tensor_parallel(d)) for k in _kinds(ests)] if ests else []


def _fmt_mfu(e) -> str:
    return "-" if e["mfu"] is None else f"{e['mfu']:.1%} ({e['mfu_dtype']})"


def est_label(e) -> str:
    return f"{e['instance']} {e['chip']} LNC={e['lnc']}" + (" (target)" if e["target"] else "")


def est_line(e) -> str:
    """One estimate in the summary: time, MFU and the terms' shares, largest first."""
    if e["missing"]:
        return e["missing"]
    unit = "per step" if e["per_step"] else "whole run"
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(e["shares"].items(), key=lambda kv: -kv[1]))
    mfu = "MFU -" if e["mfu"] is None else f"MFU {e['mfu']:.1%}"
    hidden = e.get("hidden_seconds") or 0.0
    overlap = (
        f"; {fmt_s(hidden)} of asynchronous collectives run under compute (their contention with it for the "
        f"DMA engines is not modelled: at most {fmt_s(e['step_seconds'] + hidden)} {unit} if none overlapped)"
        if hidden
        else ""
    )
    return f"{fmt_s(e['step_seconds'])} {unit}, {mfu}; {shares}{overlap}"


_PHASE_LABELS = {"prefill": "prefill (time to first token)", "decode": "decode step (time per output token)"}


def _phase_text(p: dict) -> str:
    mfu = "MFU -" if p["mfu"] is None else f"MFU {p['mfu']:.1%}"
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(p["term_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
    return f"{fmt_s(p['seconds'])} (median of {p['count']}, {p['tokens']} token(s)), {mfu}; {shares}"


def phase_lines(e) -> list:
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
                             fmt_s(p["seconds"]), _fmt_mfu(p)] + shares + [p["dominant"]])  # fmt: skip
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


PICTURE_FILES = {"Memory over time": "memory.png", "Estimated time per op": "ops.png"}


_warned_no_pictures = False


def warn_no_pictures():
    # One run may build several reports (one per `with` block); one warning is enough.
    global _warned_no_pictures
    if _warned_no_pictures:
        return
    _warned_no_pictures = True
    from . import plots

    warnings.warn(f"torch-neuronx readiness: {plots.MISSING}", UserWarning, stacklevel=4)


def code_spans(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


CANNOT_KNOW = (
    "values: losses, gradient norms and any other number read from a tensor (each read is listed "
    "with the placeholder the run got);",
    "shapes that depend on values (nonzero, masked_select, unique, ...): the run stops at the first one;",
    "numerics: NaN, overflow, loss of precision;",
    "host time: data loading, tokenization and Python overhead, which the step-time estimate does not include;",
    "memory the real device's kernels take for their own scratch buffers (not part of any tensor).",
)
# What a dry run with compiled graphs cannot know besides (it generates no code for them).
UNFUSED = (
    "which intermediates of a compiled graph its fused kernels keep on chip: the graph's ops ran one by "
    "one and each intermediate counted, so the peak is an upper bound of the real run's;"
)


SECTIONS = (
    _summary,
    _rank_classes,
    _dry_run,
    _across_ranks,
    _fallbacks,
    _compile,
    _memory_sections,
    _collective_section,
    _estimates,
    _phases,
)
