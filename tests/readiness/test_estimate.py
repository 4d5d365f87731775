"""The readiness time estimate: which chips it is for, what one step counts, MFU and time shares,
each checked against values computed here from the published figures."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_neuronx
from helpers import worker_env
from neuronsim import hardware as hw
from torch_neuronx.readiness.estimate import steps, time_model

SCRIPTS = Path(__file__).parent / "scripts"


def _est_lines(summary: str) -> list:
    return [line.strip() for line in summary.splitlines() if line.strip().startswith("est. ")]


# -- which chips ------------------------------------------------------------------
def test_trn1_target_is_estimated_first_then_trn2_and_trn3():
    a = torch.randn(64, 64, device="neuron")
    with torch_neuronx.readiness(instance="trn1.32xlarge") as r:
        a @ a
    d = r.report.data
    assert d["lnc"] == 1  # trn1 has no LNC=2: the target's own LNC, not the simulator's
    first, *others = d["estimates"]
    assert (first["instance"], first["chip"], first["lnc"], first["target"]) == ("trn1.32xlarge", "trn1", 1, True)
    assert first["missing"] is None and first["step_seconds"] > 0
    # trn1's figures: 1.3 us per DMA transfer, its 16 engines' sustained 17 B/ns below its HBM share
    assert first["figures"]["dma_fixed_s"] == 1.3e-6 and first["figures"]["memory_bytes_per_s"] == 16 * 17e9
    # the others on the instances shaped like the target (16 chips)
    assert [(e["instance"], e["target"]) for e in others] == [("trn2.48xlarge", False), ("trn3.48xlarge", False)]
    assert all(e["step_seconds"] > 0 for e in others)
    lines = _est_lines(r.report.summary())
    assert lines[0].startswith("est. trn1.32xlarge trn1 LNC=1 (target)") and "MFU" in lines[0]
    assert lines[1].startswith("est. trn2.48xlarge trn2 LNC=1 ") and "MFU" in lines[1]
    md = r.report.to_markdown()
    table = md[md.index("## Estimated time on Trainium") :].splitlines()
    rows = [t for t in table if t.startswith("| trn")]
    assert rows[0].startswith("| trn1.32xlarge (target) | trn1 | 1 |")
    # the breakdown has a column per chip with an estimate
    header = next(t for t in md[md.index("## Per-op breakdown") :].splitlines() if t.startswith("| op |"))
    assert header.endswith("| trn1 | trn2 | trn3 | bound |")


def test_chip_without_a_figure_the_model_needs_says_which(monkeypatch):
    # Every chip in the table has its figures today; the rule for one without stays.
    trn1 = dataclasses.replace(hw.CHIPS["trn1"], dma_fixed_s=None)
    monkeypatch.setattr(hw, "CHIPS", {**hw.CHIPS, "trn1": trn1})
    a = torch.randn(64, 64, device="neuron")
    with torch_neuronx.readiness(instance="trn1.32xlarge") as r:
        a @ a
    first = r.report.data["estimates"][0]
    assert first["missing"] == "no estimate for trn1: AWS publishes no DMA fixed-cost figure for it"
    lines = _est_lines(r.report.summary())
    assert lines[0].startswith("est. trn1.32xlarge trn1 LNC=1 (target)") and lines[0].endswith(first["missing"])


def test_check_cli_trn1_instance_line_comes_first(tmp_path):
    out = tmp_path / "report"
    p = subprocess.run(
        [sys.executable, "-m", "torch_neuronx.cli", "check", "--instance", "trn1.32xlarge", "--out", str(out)]
        + ["--", sys.executable, str(SCRIPTS / "plain.py")],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = _est_lines(p.stdout)
    assert [line.split()[1] for line in lines] == ["trn1.32xlarge", "trn2.48xlarge", "trn3.48xlarge"]
    assert "(target)" in lines[0] and "MFU" in lines[0]
    data = json.loads((out / "report.json").read_text())
    assert [e["chip"] for e in data["estimates"]] == ["trn1", "trn2", "trn3"]


def test_default_target_trn2_then_trn3_only():
    with torch_neuronx.readiness() as r:
        torch.ones(8, device="neuron").sum()
    assert [(e["chip"], e["instance"], e["target"]) for e in r.report.data["estimates"]] == [
        ("trn2", "trn2.3xlarge", True),
        ("trn3", "trn3.3xlarge", False),
    ]


def test_missing_figure_is_a_value_error_naming_it_and_trn1n_has_its_own_neuronlink(monkeypatch):
    gib = 1 << 30
    # the instance picks the NeuronLink bandwidth (trn1n.32xlarge doubles trn1.32xlarge's)
    # what a core can send: half its share of the chip's figure, which counts both directions
    assert time_model.core_figures("trn1", 1, "trn1.32xlarge")["link_bytes_per_s"] == 384 * gib / 2 / 2
    assert time_model.core_figures("trn1", 1, "trn1n.32xlarge")["link_bytes_per_s"] == 768 * gib / 2 / 2
    fig = time_model.core_figures("trn1", 1)
    # the core's 16 DMA engines x 17 B/ns sustained are below its share of 820 GB/s HBM
    assert fig["memory_bytes_per_s"] == 16 * 17e9 and fig["tensor_flops"]["bfloat16"] == 95e12
    trn1 = dataclasses.replace(hw.CHIPS["trn1"], dma_fixed_s=None)
    monkeypatch.setattr(hw, "CHIPS", {**hw.CHIPS, "trn1": trn1})
    with pytest.raises(hw.MissingFigure, match="no estimate for trn1: AWS publishes no DMA fixed-cost"):
        time_model.core_figures("trn1", 1)
    assert issubclass(hw.MissingFigure, ValueError)


# -- what a step counts -------------------------------------------------------------
def test_gradient_accumulation_step_is_its_micro_batches_plus_one_optimizer_step():
    # Without autograd, so that every micro-batch runs the same ops (autograd's first
    # backward of a step hands its gradient over, the later ones add to it).
    w = torch.nn.Parameter(torch.randn(128, 128, device="neuron"))
    w.grad = torch.ones_like(w)
    opt = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(64, 128, device="neuron")

    def micro_batch():
        with torch.no_grad():
            (x @ w).relu().sum()

    with torch_neuronx.readiness() as alone:
        micro_batch()
    with torch_neuronx.readiness() as optimizer_only:
        opt.step()
    with torch_neuronx.readiness() as accumulated:
        for _ in range(3):
            for _ in range(4):
                micro_batch()
            opt.step()
    assert accumulated.report.data["steps"] == 3
    for m, o, a in zip(*(r.report.data["estimates"] for r in (alone, optimizer_only, accumulated))):
        assert not m["per_step"] and o["per_step"] and a["per_step"]
        assert a["step_seconds"] == pytest.approx(4 * m["step_seconds"] + o["step_seconds"], rel=1e-9)
        mm = next(op for op in a["ops"] if op["op"] == "aten::mm")
        assert mm["count"] == 4 and mm["flops"] == 4 * 2 * 64 * 128 * 128


# -- MFU and shares -------------------------------------------------------------------
def test_mfu_is_matmul_flops_over_time_times_peak_of_the_main_dtype():
    n, k = 512, 64
    a = torch.randn(n, n, device="neuron", dtype=torch.bfloat16)
    b = torch.randn(k, k, device="neuron")
    with torch_neuronx.readiness(instance="trn2.3xlarge") as r:
        a @ a
        a @ a
        b @ b  # float32: counted as model FLOPs; bfloat16 has most of them and sets the peak
    flops = 2 * 2 * n**3 + 2 * k**3
    for est in r.report.data["estimates"]:
        peak = hw.CHIPS[est["chip"]].tensor_flops["bfloat16"] * est["lnc"]  # one rank, one logical core
        assert est["model_flops"] == flops and est["mfu_dtype"] == "bfloat16"
        assert est["mfu"] == pytest.approx(flops / (est["step_seconds"] * peak), rel=1e-12)
        assert 0 < est["mfu"] < 1
    line = _est_lines(r.report.summary())[0]
    assert f"MFU {r.report.data['estimates'][0]['mfu']:.1%}" in line


def test_time_shares_sum_to_one_in_data_json_and_tables(tmp_path):
    model = torch.nn.Linear(256, 256).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 256, device="neuron")
    with torch_neuronx.readiness(out=str(tmp_path)) as r:
        for _ in range(3):
            model(x).relu().sum().backward()
            opt.step()
            opt.zero_grad()
    saved = json.loads((tmp_path / "report.json").read_text())["estimates"]
    for est, js in zip(r.report.data["estimates"], saved):
        assert set(est["shares"]) == {"compute", "memory", "fixed", "collectives"}
        assert sum(est["shares"].values()) == pytest.approx(1.0)
        assert js["shares"] == pytest.approx(est["shares"]) and js["mfu"] == pytest.approx(est["mfu"])
        terms = est["terms"]
        assert est["shares"]["fixed"] == pytest.approx(terms["fixed"] / sum(terms.values()))
    md = (tmp_path / "report.md").read_text()
    header = (
        "| instance | chip | LNC | time | MFU | compute | memory | fixed | collectives | collectives under compute |"
    )
    assert header in md
    html = (tmp_path / "report.html").read_text()
    assert "<th>MFU</th>" in html and "<th>collectives</th>" in html


def test_linear_and_attention_under_inference_mode_count_their_matmuls():
    """Under torch.inference_mode autograd does not decompose linear and SDPA: they reach the
    recording whole and must count the FLOPs of the matmuls they run, as under no_grad."""
    import torch.nn.functional as F

    flops = {}
    for ctx in (torch.no_grad, torch.inference_mode):
        with torch_neuronx.readiness() as r:
            lin = torch.nn.Linear(1024, 1024, device="neuron")
            q = torch.randn(1, 4, 256, 64, device="neuron")
            with ctx():
                lin(torch.randn(512, 1024, device="neuron"))
                F.scaled_dot_product_attention(q, q, q)
        flops[ctx.__name__] = r.report.data["estimates"][0]["tensor_flops"]
    expected = 2 * 512 * 1024 * 1024 + 2 * (2 * 4 * 256 * 256 * 64)  # x @ W^T; Q K^T and P V
    assert flops["inference_mode"] == flops["no_grad"] == {"float32": expected}


def _matmul_bucket(n: int):
    from torch_neuronx.readiness.record.recording import Bucket, OpCall

    b = Bucket()
    b.ops[OpCall("aten::mm", "bfloat16", "tensor", 2 * n**3, 3 * 2 * n**2, 3)] = 1
    return b


def test_the_step_estimate_leaves_out_the_first_step_of_several():
    from torch_neuronx.readiness.record.recording import Recording

    # the first step also builds the model and optimizer state: here 8x the others' matmul work
    big, small = _matmul_bucket(8192), _matmul_bucket(4096)
    for n_steps, buckets in ((2, [big, small]), (3, [big, small, small])):
        est = steps.estimate([Recording(rank=0, steps=n_steps, buckets=buckets)], "trn2", 2)
        assert est.step_seconds == est.bucket_seconds[1] < est.bucket_seconds[0] / 4
    alone = steps.estimate([Recording(rank=0, steps=1, buckets=[big])], "trn2", 2)
    assert alone.step_seconds == alone.bucket_seconds[0]  # the only step is the estimate


# -- communication overlap -------------------------------------------------------------
def _bucket_with(collective_bytes: int, asynchronous: bool):
    from torch_neuronx.readiness.record.recording import Bucket, CollectiveCall, OpCall, Recording

    b = Bucket()
    b.ops[OpCall("aten::mm", "bfloat16", "tensor", 2 * 4096**3, 3 * 2 * 4096**2, 3)] = 1
    if collective_bytes:
        b.collectives[CollectiveCall("allreduce", "bfloat16", collective_bytes, 64, asynchronous)] = 1
    return Recording(rank=0, buckets=[b]), b


def test_asynchronous_collectives_run_under_compute_and_only_their_excess_adds():
    from torch_neuronx.readiness import TimeModel

    model = TimeModel("trn2", 2, "trn2.48xlarge")
    rec, b = _bucket_with(0, False)
    compute = model.bucket(rec, b).seconds
    for nbytes in (1 << 20, 1 << 30):  # one shorter than the matmul, one longer
        comm = model.collective_seconds("allreduce", nbytes, 64)
        rec, b = _bucket_with(nbytes, False)
        assert model.bucket(rec, b).seconds == pytest.approx(compute + comm)  # waited for: adds whole
        rec, b = _bucket_with(nbytes, True)
        est = model.bucket(rec, b)
        assert est.seconds == pytest.approx(max(compute, comm))
        assert est.hidden_seconds == pytest.approx(min(compute, comm))
    assert (
        model.collective_seconds("allreduce", 1 << 20, 64)
        < compute
        < model.collective_seconds("allreduce", 1 << 30, 64)
    )


def test_the_recording_says_which_collectives_were_issued_asynchronously():
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "neuron", rank=0, world_size=1, store=dist.HashStore(), timeout=datetime.timedelta(seconds=30)
    )
    try:
        x = torch.ones(16, device="neuron")
        with torch_neuronx.readiness() as r:
            dist.all_reduce(x)  # waited for
            dist.all_reduce(x, async_op=True).wait()
            with torch.neuron.stream(torch.neuron.Stream()):
                dist.all_gather_into_tensor(torch.empty(16, device="neuron"), x)  # FSDP2's way
    finally:
        dist.destroy_process_group()
    calls = sorted((c.kind, c.asynchronous) for b in r.recording.buckets for c in b.collectives)
    assert calls == [("allgather_base", True), ("allreduce", False), ("allreduce", True)], calls
