"""The report's pictures (PNG bytes): memory over time per core, estimated time per op."""

from __future__ import annotations

import io

GiB = float(1 << 30)
MISSING = (
    "The pictures (memory over time, estimated time per op) are left out: they need matplotlib, "
    "which is not installed. To get them, `pip install matplotlib` (it also comes with "
    "`torch-neuronx[hf]`) and run the report again."
)


def available() -> bool:
    """Whether matplotlib can be imported (the pictures need it; the rest of the report does not)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width=8.0, height=3.6):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    return Figure(figsize=(width, height), dpi=100)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def memory_png(cores: list, capacity: int) -> bytes:
    """cores: [{"label", "series": [(t, allocated, reserved)]}]."""
    fig = _figure()
    ax = fig.add_subplot()
    for c in cores:
        if not c["series"]:
            continue
        t = [s[0] for s in c["series"]]
        ax.plot(t, [s[1] / GiB for s in c["series"]], label=f"{c['label']} allocated")
        ax.plot(t, [s[2] / GiB for s in c["series"]], linestyle="--", label=f"{c['label']} reserved")
    peak = max([s[2] for c in cores for s in c["series"]] + [1])
    on_scale = peak > capacity / 4
    ax.axhline(
        capacity / GiB,
        color="red",
        linewidth=1,
        label="HBM capacity per core" + ("" if on_scale else f" ({capacity / GiB:.0f} GiB, off scale)"),
    )
    ax.set_xlabel("time since start (s, simulator)")
    ax.set_ylabel("GiB")
    ax.set_title("Device memory per logical NeuronCore")
    ax.set_ylim(0, max(peak, capacity) / GiB * 1.08 if on_scale else peak / GiB * 1.2)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def ops_png(estimates: list, top: int = 12) -> bytes:
    """Horizontal bars: estimated time per op in one step, one bar per chip."""
    first = estimates[0]
    names = [e["op"] + (f" [{e['dtype']}]" if e["dtype"] else "") for e in first["ops"][:top]]
    keys = [(e["op"], e["dtype"]) for e in first["ops"][:top]]
    fig = _figure(height=max(2.4, 0.32 * len(names) + 1.2))
    ax = fig.add_subplot()
    width = 0.8 / len(estimates)
    for j, est in enumerate(estimates):
        by = {(e["op"], e["dtype"]): e["seconds"] for e in est["ops"]}
        ax.barh(
            [i + j * width for i in range(len(keys))],
            [by.get(k, 0.0) * 1e3 for k in keys],
            height=width,
            label=f"{est['chip']} (LNC={est['lnc']})",
        )
    ax.set_yticks([i + width * (len(estimates) - 1) / 2 for i in range(len(keys))], names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("estimated ms per step")
    ax.set_title("Estimated time per op on Trainium")
    ax.legend(fontsize=7)
    return _png(fig)
