"""torch_neuronx.readiness and `torch-neuronx check`: reports checked against known
values (source lines, byte counts, published figures)."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx
from helpers import worker_env
from neuronsim import hardware as hw
from torch_neuronx.readiness.estimate import assumptions, time_model
from torch_neuronx.readiness.estimate import collective_time as _collective_time
from torch_neuronx.readiness.record.recording import Bucket, CollectiveCall, Recording

SCRIPTS = Path(__file__).parent / "scripts"
MiB = 1 << 20


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def _check(tmp_path, *cmd, options=(), timeout=600):
    out = tmp_path / "report"
    p = subprocess.run(
        [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out), *options, "--", *cmd],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p, out


def _op(est, name):
    return next(o for o in est["ops"] if o["op"] == name)


# -- in process ---------------------------------------------------------------
def test_fallback_op_source_line_steps_and_verdict():
    model = torch.nn.Linear(8, 8).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_neuronx.readiness() as r:
        for _ in range(3):
            model(torch.randn(4, 8, device="neuron")).sum().backward()
            line = inspect.currentframe().f_lineno + 1
            torch.ones(3, device="neuron", dtype=torch.float64).cumsum(0)
            opt.step()
            opt.zero_grad()
    rep = r.report
    assert rep.data["steps"] == 3
    fbs = {f["op"]: f for f in rep.data["fallbacks"]}
    assert set(fbs) == {"aten::ones", "aten::cumsum"}  # ones runs fill_ in float64 inside it
    for fb in fbs.values():
        assert (fb["dtype"], fb["count"]) == ("float64", 3)
        assert list(fb["sites"]) == [f"{__file__}:{line} (test_fallback_op_source_line_steps_and_verdict)"]
    assert rep.verdict == "runs with 2 fallbacks (6 calls on CPU)"
    # addmm was timed once per step, for the median step
    assert _op(rep.data["estimates"][0], "aten::addmm")["count"] == 1


class _Optimizers(torch.optim.Optimizer):
    """A container of optimizers that is itself one (torchtitan's, one optimizer per model part)."""

    def __init__(self, parts):
        self.parts = [torch.optim.SGD(p.parameters(), lr=0.1) for p in parts]
        super().__init__([p for o in self.parts for g in o.param_groups for p in g["params"]], {})

    def step(self, closure=None):
        for o in self.parts:
            o.step()


def test_a_step_of_a_container_of_optimizers_is_one_step():
    parts = [torch.nn.Linear(8, 8).to("neuron") for _ in range(2)]
    opt = _Optimizers(parts)
    with torch_neuronx.readiness() as r:
        for _ in range(3):
            parts[1](parts[0](torch.randn(4, 8, device="neuron"))).sum().backward()
            opt.step()
            opt.zero_grad()
        torch.optim.SGD(parts[0].parameters(), lr=0.1).step()  # a plain optimizer's step after it still counts
    assert r.report.data["steps"] == 4
    assert [sum(b.ops.values()) > 0 for b in r.recording.buckets[:3]] == [True] * 3  # each step has its work


def test_native_run_has_no_fallbacks_and_whole_run_scope():
    with torch_neuronx.readiness() as r:
        x = torch.randn(16, 16, device="neuron")
        (x @ x).relu_()
    assert r.report.verdict == "runs natively"
    est = r.report.data["estimates"][0]
    assert est["per_step"] is False and est["step_seconds"] > 0
    assert _op(est, "aten::mm")["flops"] == 2 * 16**3


def test_a_recording_adopts_device_tensors_made_before_it_but_not_a_leaked_vmap_wrapper():
    model = torch.ones(1024, device="neuron")  # made before the recording: counted in it
    leaked = []
    torch.func.vmap(lambda x: leaked.append(x) or x)(torch.ones(2, 3, device="neuron"))
    assert type(leaked[0]) is torch.Tensor  # vmap's wrapper, which has no storage to read
    with torch_neuronx.readiness() as r:
        y = model * 2
    del y
    (mem,) = r.report.data["memory"]
    assert mem["peak_allocated"] >= 2 * model.nbytes
    assert r.recording.recorder_errors == {}


def test_memory_peak_fit_verdict_and_largest_tensors(monkeypatch):
    from torch_neuronx.readiness.record.observers import memory

    # no timed samples after the first: the peak must be caught when it is allocated
    monkeypatch.setattr(memory, "_SAMPLE_S", 3600.0)
    torch.neuron.empty_cache()
    with torch_neuronx.readiness(capacity=12 * MiB) as r:
        a = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
        b = torch.zeros(16 * MiB, dtype=torch.uint8, device="neuron")  # the peak: 20 MiB live
        del b
        a.fill_(1)
    rep = r.report
    (mem,) = rep.data["memory"]
    assert mem["peak_allocated"] >= 20 * MiB
    assert not mem["fits"]
    assert rep.verdict.startswith("will not fit: peak") and "12.00 MiB per core on trn2.3xlarge at LNC=2" in rep.verdict
    assert mem["top_tensors"][0]["bytes"] == 16 * MiB and mem["top_tensors"][0]["op"] == "aten::zeros"
    fit = {(f["chip"], f["lnc"]): f["fits"] for f in rep.data["fit"]}
    assert fit[("trn2", 2)] == "yes" and set(fit) == {(c, n) for c, s in hw.CHIPS.items() for n in s.lnc_allowed}


def test_fits_against_the_instance_capacity():
    with torch_neuronx.readiness(instance="trn3.3xlarge", lnc=1) as r:
        torch.ones(1024, device="neuron").sum()
    assert r.report.data["capacity_per_core"] == 18 * (1 << 30)
    assert all(m["fits"] for m in r.report.data["memory"]) and r.report.verdict == "runs natively"


# -- the time model -----------------------------------------------------------
def test_large_bf16_matmul_is_within_10pc_of_flops_over_the_measured_rate():
    # the Tensor Engine at the efficiency AWS's tutorial matmul measured (6.97 ms on trn1)
    from torch_neuronx.readiness.estimate.time_model import TENSOR_ENGINE_EFFICIENCY

    n = 2048
    with torch_neuronx.readiness(dry_run=True) as r:  # the estimate without the CPU's slow bf16 matmul
        a = torch.randn(n, n, device="neuron", dtype=torch.bfloat16)
        a @ a
    for est in r.report.data["estimates"]:
        peak = hw.CHIPS[est["chip"]].tensor_flops["bfloat16"] * est["lnc"]
        ideal = 2 * n**3 / (peak * TENSOR_ENGINE_EFFICIENCY)
        assert _op(est, "aten::mm")["seconds"] == pytest.approx(ideal, rel=0.10)
        assert est["dominant"] == "compute"


def test_large_elementwise_is_within_10pc_of_bytes_over_bandwidth():
    n = 8 * MiB
    x, y = torch.ones(n, device="neuron"), torch.ones(n, device="neuron")
    with torch_neuronx.readiness() as r:
        x + y
    for est in r.report.data["estimates"]:
        # The published bound: the core's share of HBM bandwidth, or (trn3) its DMA engines' peak.
        spec = hw.CHIPS[est["chip"]]
        bw = min(spec.hbm_bytes_per_s / spec.physical_cores, spec.dma_engines * spec.dma_bytes_per_s_per_engine)
        bw *= est["lnc"]
        add = _op(est, "aten::add.Tensor")
        assert add["bytes"] == 3 * 4 * n
        assert add["seconds"] == pytest.approx(3 * 4 * n / bw, rel=0.10)
        assert est["dominant"] == "memory"


def test_small_ops_are_dominated_by_fixed_costs():
    fig = time_model.core_figures("trn2", 2)
    t, parts = time_model.op_time(fig, "vector", "float32", 0, 3 * 4 * 128, 3)
    assert parts["fixed"] == pytest.approx(3 * hw.CHIPS["trn2"].dma_fixed_s) and t > 10 * parts["memory"]


def test_collectives_unknown_to_the_model_are_listed_as_approximated():
    nbytes = 8 << 20
    assert not _collective_time.is_approximated("broadcast")
    rec = Recording(buckets=[Bucket(), Bucket()])
    for b in rec.buckets:  # listed once however often it ran
        b.collectives[CollectiveCall("made_up_collective", "float32", nbytes, 8)] = 1
    rec.buckets[0].collectives[CollectiveCall("broadcast", "float32", nbytes, 8)] = 1
    assert assumptions.approximations([rec]) == [
        "approximated: made_up_collective (no formula for them here; each timed as an all-gather of its bytes)."
    ]


# -- rendering and bad input ----------------------------------------------------
def test_saved_report_files(tmp_path):
    with torch_neuronx.readiness(out=str(tmp_path)) as r:
        torch.randn(32, 32, device="neuron").double().sum()
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {"report.json", "report.md", "report.html", "memory.png", "ops.png"}
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "aten::sum" in html
    md = (tmp_path / "report.md").read_text()
    assert "## Estimated time on Trainium" in md and "![Memory over time](memory.png)" in md
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == r.report.verdict


def _assert_saved_without_pictures(out: Path, extra: frozenset = frozenset()):
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.html"} | extra
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## Estimated time on Trainium" in md and "aten::" in md
    assert "](memory.png)" not in md and "data:image/png" not in html
    for text in (md, html):
        assert "need matplotlib" in text and "pip install matplotlib" in text
    assert json.loads((out / "report.json").read_text())["estimates"]


def test_saved_report_without_matplotlib_has_no_pictures_and_says_how_to_get_them(tmp_path, monkeypatch):
    from torch_neuronx.readiness.report import render

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.setattr(render, "_warned_no_pictures", False)
    with pytest.warns(UserWarning, match="pip install matplotlib") as caught:
        for out in (tmp_path / "a", tmp_path / "b"):
            with torch_neuronx.readiness(out=str(out)) as r:
                torch.randn(32, 32, device="neuron").sum()
            _assert_saved_without_pictures(out)
    assert len([w for w in caught if "matplotlib" in str(w.message)]) == 1
    assert r.report.pictures() == {} and "readiness" in r.report.summary()


def test_bad_options_raise_clear_errors():
    with pytest.raises(ValueError, match="not a supported instance type"):
        torch_neuronx.readiness(instance="trn9.huge")
    with pytest.raises(ValueError, match="supports LNC=\\(1, 2\\), not LNC=3"):
        with torch_neuronx.readiness(lnc=3):
            pass
    with pytest.raises(ValueError, match="capacity must be a positive number of bytes"):
        with torch_neuronx.readiness(capacity=-1):
            pass


@pytest.mark.slow
def test_new_shape_every_step_is_reported_as_recompiling_every_step(fresh_dynamo):
    w = torch.ones(4, device="neuron")
    opt = torch.optim.SGD([torch.nn.Parameter(w.clone())], lr=0.1)
    f = torch.compile(lambda x: (x * w).sum(), backend="neuron")
    with torch_neuronx.readiness() as r, torch.no_grad():
        for n in range(2, 6):
            f(torch.ones(n, 4, device="neuron"))
            opt.step()  # marks the step
    c = r.report.data["compile"]
    assert c["step_recompilations"][1:] == [1, 1, 1]
    assert c["recompiles_every_step"] and c["dynamic_shapes"]
    for n, rc in zip((3, 4, 5), c["recompilations"][-3:]):
        assert [n, 4] in [list(s[0]) for s in rc["shapes"] if isinstance(s, (list, tuple))]  # what recompiled
    assert r.report.verdict == "recompiles every step"


def test_compiled_graph_cost_parts_have_known_values():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.readiness.record.measure import graph_parts
    from torch_neuronx.readiness.record.measure import is_dynamic as _is_dynamic
    from torch_neuronx.readiness.record.recording import GraphPart

    def f(x, w):
        return torch.nn.functional.gelu(x @ w) * 2 + x.t().sum()  # the view x.t() is seen through

    m, k, n = 8, 16, 4
    gm = make_fx(f, tracing_mode="fake")(torch.randn(m, k), torch.randn(k, n))
    mm, fused = graph_parts(gm)
    assert mm == GraphPart("tensor", "float32", 2 * m * k * n, 4 * (m * k + k * n + m * n), 3, ((m, k, n, 1),))
    # a tiny matmul occupies one instruction of the Tensor Engine: 64 cycles of the 128 x 128 array
    assert time_model.tile_flops(time_model.core_figures("trn2", 2), mm) == 2 * 128 * 128 * 64
    # gelu, mul, sum, add: one operation per element each reads or writes
    ops = 2 * m * n + 2 * m * n + (m * k + 1) + (m * n + 1 + m * n)
    # reads the matmul result and x (through the view), writes the graph output; once each
    assert fused == GraphPart("fused", "float32", ops, 4 * (m * n + m * k + m * n), 3)
    # a graph for symbolic shapes has no one cost: its runs are timed op by op
    assert not _is_dynamic(gm) and _is_dynamic(
        make_fx(f, tracing_mode="symbolic")(torch.randn(m, k), torch.randn(k, n))
    )


def test_a_compiled_static_cache_update_moves_the_rows_it_writes():
    # A static KV cache updated in place inside a graph (as AOTAutograd keeps an inference graph's
    # input mutations): the update reads its indices and values and writes the values, as eager
    # does; the cache is read whole only where attention reads it (the matmul).
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.readiness.record.measure import graph_parts

    def f(cache, pos, new, q):
        torch.ops.aten.index_put_(cache, [None, pos], new * 2)  # the new row, scaled (fused), written in place
        return q @ cache.transpose(1, 2)

    heads, length, dim = 2, 64, 16
    gm = make_fx(f, tracing_mode="fake")(
        torch.zeros(heads, length, dim), torch.tensor([5]), torch.randn(heads, 1, dim), torch.randn(heads, 1, dim)
    )
    parts = graph_parts(gm)
    (fused,) = [p for p in parts if p.kind == "fused"]
    new, pos = 4 * heads * dim, 8
    # reads the position and the new row, and writes the doubled row where the position says (the
    # values and indices, as eager's rule counts an in-place partial write); not the 8 KiB cache
    assert fused.bytes == (pos + new) + (pos + new)


@pytest.mark.slow  # one Inductor compile of a forward and backward graph: ~25 s
def test_compiled_graphs_are_costed_whole_once_per_run(monkeypatch, fresh_dynamo):
    from torch_neuronx.profiler import _graphs

    def mlp():
        torch.manual_seed(0)
        layers = [torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64)]
        return torch.nn.Sequential(*layers).to("neuron")

    def train(model, steps=3, live_ops=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch_neuronx.readiness() as r:
            for _ in range(steps):
                loss = model(x).sum()
                if live_ops is not None:  # what the forward left alive for the backward
                    live_ops.update(e.op for e in r._session.executor.ledger.live.values())
                loss.backward()
                opt.step()
                opt.zero_grad()
        return r.report.data, r.recording

    x = torch.randn(32, 64, device="neuron")
    compiled = torch.compile(mlp(), backend="neuron")
    with torch_neuronx.readiness() as r:  # compiled while a report records: costed in it too
        compiled(x).sum().backward()
    ops = [o["op"] for o in r.report.data["estimates"][0]["ops"]]
    # graph names count the process's graphs: "compiled graph graph_<n> forward|backward"
    names = sorted((o for o in ops if o.startswith("compiled graph graph_")), key=lambda o: o.endswith("backward"))
    assert [n.rsplit(" ", 1)[1] for n in names] == ["forward", "backward"]
    assert names[0].rsplit(" ", 1)[0] == names[1].rsplit(" ", 1)[0]
    assert ops[:2] == names[::-1]
    # the reports below see the graphs warm: compiled before they started
    eager, _ = train(mlp())
    live_ops = set()
    data, raw = train(compiled, live_ops=live_ops)
    est, eager_est = data["estimates"][0], eager["estimates"][0]

    # every step ran each graph once, counted whole: no ATen op of their code is also counted
    assert [dict(b.graphs) for b in raw.buckets[:3]] == [dict.fromkeys(names, 1)] * 3
    rows = {o["op"]: o for o in est["ops"]}
    assert [rows[g]["count"] for g in names] == [1, 1]
    assert not {"aten::mm.out", "aten::addmm.out"} & set(rows)
    eager_rows = {o["op"]: o for o in eager_est["ops"]}
    # the matmuls inside (extern kernels the mode also sees) are counted once, inside their graph
    assert rows[names[0]]["flops"] == eager_rows["aten::addmm"]["flops"]
    assert rows[names[1]]["flops"] == eager_rows["aten::mm"]["flops"]

    # the graphs' elementwise work is timed: more than their matmuls alone
    fig = time_model.core_figures(est["chip"], est["lnc"])
    matmuls = sum(time_model.call_time(fig, p)[0] for ps in raw.graph_parts.values() for p in ps if p.kind == "tensor")
    assert rows[names[0]]["seconds"] + rows[names[1]]["seconds"] > 1.2 * matmuls
    # fusion saves HBM traffic and DMA fixed costs, so compiled is faster, but not by 2x here
    assert 0.5 * eager_est["step_seconds"] < est["step_seconds"] < eager_est["step_seconds"]
    assert data["verdict"] == eager["verdict"] == "runs natively"
    assert _graphs._listener is None  # the report let go of the graphs when it stopped
    # memory is tracked inside graphs as outside: the buffers their code allocates are seen (not
    # necessarily among the largest at the peak: tensors earlier tests in this worker hold compete)
    assert "aten::empty_strided" in live_ops

    # a graph without its ATen graph is timed op by op, as before
    graph = names[0].removeprefix("compiled graph ").rsplit(" ", 1)[0]
    for f in [f for f, n in _graphs._names.items() if n.startswith(graph + " ")]:
        monkeypatch.delitem(_graphs._gms, f)
    data, raw = train(compiled, steps=1)
    rows = {o["op"]: o for o in data["estimates"][0]["ops"]}
    assert not any(o.startswith("compiled graph") for o in rows) and not raw.buckets[0].graphs
    assert rows["aten::mm.out"]["flops"] == eager_rows["aten::mm"]["flops"]  # Inductor's extern kernel
    assert "aten::gelu" not in rows  # Inductor's own kernels are not ATen ops: unseen then


# -- torch-neuronx check --------------------------------------------------------
def test_check_cli_plain_python(tmp_path):
    p, out = _check(tmp_path, sys.executable, str(SCRIPTS / "plain.py"), "--flag", "7")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "args ['--flag', '7']" in p.stdout
    assert "torch-neuronx readiness: runs natively" in p.stdout
    data = json.loads((out / "report.json").read_text())
    assert _op(data["estimates"][0], "aten::mm")["flops"] == 2 * 64**3


def test_check_cli_without_matplotlib_writes_the_report(tmp_path):
    out = tmp_path / "report"
    # the report is built by the `check` process: matplotlib is made unimportable there
    cli = "import sys; sys.modules['matplotlib'] = None; from torch_neuronx.cli import main; sys.exit(main())"
    p = subprocess.run(
        [sys.executable, "-c", cli, "check", "--out", str(out), "--", sys.executable, str(SCRIPTS / "plain.py")],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "torch-neuronx readiness: runs natively" in p.stdout
    assert p.stderr.count("pip install matplotlib") == 1
    _assert_saved_without_pictures(out, {"recordings"})
    # the rank's recording the report was merged from, next to it
    rec = torch_neuronx.readiness.Recording.from_json((out / "recordings" / "rank0.json").read_text())
    assert rec.rank == 0 and not rec.dry_run and rec.memory[0].peak_allocated > 0


def test_check_cli_usage_errors(tmp_path):
    p, _ = _check(tmp_path)
    assert p.returncode == 2 and "give the command after --" in p.stderr
    p, _ = _check(tmp_path, "ls")
    assert p.returncode == 2 and "cannot run 'ls'" in p.stderr and "accelerate launch" in p.stderr


@pytest.mark.slow
def test_check_cli_reports_float64_op_and_graph_break_lines(tmp_path):
    script = SCRIPTS / "fallback_and_break.py"
    p, out = _check(tmp_path, sys.executable, str(script))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "script finished" in p.stdout
    data = json.loads((out / "report.json").read_text())
    (fb,) = data["fallbacks"]
    assert (fb["op"], fb["dtype"], fb["count"]) == ("aten::cumsum", "float64", 3)
    assert list(fb["sites"]) == [f"{script}:{_line(script, 'LINE_FLOAT64')} (<module>)"]
    breaks = data["compile"]["graph_breaks"]
    assert breaks and breaks[0]["site"] == f"{script}:{_line(script, 'LINE_GRAPH_BREAK')}"
    assert "Tensor.item()" in breaks[0]["reason"]
    assert data["compile"]["graphs"] and data["steps"] == 3
    assert "Graph break in user code" not in p.stderr  # Dynamo's log stays as quiet as the user set it


@pytest.mark.multiprocess
def test_check_cli_torchrun_two_ranks_ddp_collectives(tmp_path):
    p, out = _check(tmp_path, "torchrun", "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "ddp_steps.py"))
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((out / "report.json").read_text())
    assert data["ranks"] == 2 and data["steps"] == 5
    # DDP's setup broadcasts run in the first step, which the steady state leaves out; its
    # one-off rebuild of the gradient buckets (broadcasts of a few int32) comes in the second.
    (c,) = [c for c in data["collectives"] if c["kind"] == "allreduce"]
    assert (c["dtype"], c["bytes"], c["group_size"], c["calls_per_step"]) == ("float32", 4096, 2, 1)
    assert all(c["kind"] == "broadcast" and c["dtype"] == "int32" for c in data["collectives"][1:])
    # the median step: one all-reduce of 4 KiB inside a trn2 instance, whose latency is the floor
    # AWS measured for it (nccom-test, SDK 2.32: 101.14 us)
    est = data["estimates"][0]
    assert est["terms"]["collective latency"] == pytest.approx(101.14e-6)
    # both ranks' peaks are kept; ranks identical in every memory figure share a row of the tables
    assert [(m["rank"], m["core"]) for m in data["memory_per_rank"]] == [(0, 0), (1, 1)]
    labels = {m["label"] for m in data["memory"]}
    peaks = {(m["peak_allocated"], m["peak_reserved"]) for m in data["memory_per_rank"]}
    if len(peaks) == 1 and len(data["memory"]) == 1:  # identical ranks: one row naming both
        assert labels == {"ranks 0-1"} and data["memory"][0]["ranks"] == [0, 1]
    else:  # they differ in some figure the tables show: a row each
        assert labels == {"rank 0 neuron:0", "rank 1 neuron:1"}
        a, b = data["memory"]
        assert [a[k] for k in ("peak_allocated", "peak_reserved", "top_tensors")] != [
            b[k] for k in ("peak_allocated", "peak_reserved", "top_tensors")
        ]
