"""The estimates of AWS's published training figures (benchmarks/published.py), pinned.

Each configuration's recording at real size (written by ``python benchmarks/published.py
--save DIR``; copied to tests/readiness/data/published_<row>.json) is estimated again here, so
that a change to the time model or the hardware table that moves a row is seen: update the pin
and the table in docs/benchmarks.md together. The model terms the rows need (the pipeline
schedule, collectives between instances, attention on the Tensor Engine, compiled graphs in a
dry run) are checked against values computed here.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from neuronsim import hardware as hw
from torch_neuronx.readiness.estimate import collective_time as _collective_time
from torch_neuronx.readiness.estimate import known_error as _known_error
from torch_neuronx.readiness.estimate import time_model

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(REPO / "benchmarks"))
import published  # noqa: E402

# The pins: the rows' estimates today, in the known-error table reports print their error from
# (docs/benchmarks.md has the table).
BERT = _known_error.row("BERT-Large phase-1 pre-training, trn1.32xlarge, DP=32")
BERT_MFU = 0.3293
LLAMA = _known_error.row("Llama-3.1-70B pre-training, 32 x trn1.32xlarge, TP=32 x PP=8 x DP=4")
LLAMA_MFU = 0.3596


def _recording(name: str):
    return published.load(DATA / f"published_{name}.json")


# -- the rows -----------------------------------------------------------------------------
def test_bert_large_phase1_on_trn1_32xlarge_is_pinned():
    row = published.bert_row(_recording("bert"))
    assert (row["aws"], row["unit"]) == (BERT.aws, BERT.unit) == (3826.6, "seq/s")
    assert row["estimate"] == pytest.approx(BERT.estimate, rel=1e-3)
    assert row["ratio"] == pytest.approx(row["estimate"] / 3826.6)
    assert row["mfu"] == pytest.approx(BERT_MFU, rel=1e-3)


def test_llama31_70b_on_32_trn1_32xlarge_is_pinned():
    raws = _recording("llama70b")
    assert [r.extra["index"] for r in raws] == [0, 1, 7]
    row = published.llama_row(raws)
    assert (row["aws"], row["unit"]) == (LLAMA.aws, LLAMA.unit) == (7.94, "seq/s")
    assert row["estimate"] == pytest.approx(LLAMA.estimate, rel=1e-3)
    assert row["mfu"] == pytest.approx(LLAMA_MFU, rel=1e-3)


def test_every_row_has_the_keys_the_table_merges_on():
    import published_inference

    keys = {"figure", "configuration", "aws", "estimate", "unit", "ratio", "mfu"}
    eager = published_inference.recording(str(DATA / "llama405b_tp64_raw.json"))
    compiled = published_inference.recording(str(DATA / "llama405b_tp64_compiled.json"))
    rows = [published.bert_row(_recording("bert")), published.llama_row(_recording("llama70b"))]
    rows += [f(eager) for f in published_inference.EAGER_ROWS]  # these add what dominates each phase
    rows += [f(compiled) for f in published_inference.COMPILED_ROWS]
    assert [sorted(keys - set(r)) for r in rows] == [[]] * 6
    # the rows are the known-error table's, from which reports print the model's error
    assert [r["estimate"] for r in rows] == pytest.approx([k.estimate for k in _known_error.ROWS], rel=1e-3)
    table = published.to_markdown(rows).splitlines()
    assert (
        table[0] == "| configuration | AWS | estimate | ratio | implied MFU | within 0.87-1.15 |"
        and len(table) == 2 + 6 + 2
    )
    mae = sum(abs(r["ratio"] - 1) for r in rows) / 6
    assert table[-1] == f"Mean absolute error {mae:.1%}; 5 of 6 rows within 0.87-1.15."
    assert table[2].startswith("| BERT-Large phase-1 pre-training throughput: trn1.32xlarge, DP=32")
    assert table[5].startswith("| Llama-3.1-405B inference: time per output token")


# -- the model terms they need ----------------------------------------------------------------
def test_pipeline_is_1f1b_sum_of_stages_plus_slowest_for_the_other_micro_batches():
    assert time_model.pipeline_seconds([1.0] * 8, 256) == 256 + 8 - 1  # M + P - 1 slots
    assert time_model.pipeline_seconds([1.0, 2.0, 1.0], 4) == 1 + 2 + 1 + 3 * 2
    with pytest.raises(ValueError, match="at least one stage and one micro-batch"):
        time_model.pipeline_seconds([1.0], 0)


def test_collective_across_instances_runs_at_the_ranks_share_of_efa():
    fig = time_model.core_figures("trn1", 1, "trn1.32xlarge")
    assert fig["efa_bytes_per_s"] == 800e9 / 8 / 32  # 800 Gbps per instance, 32 cores
    nbytes = 4 << 20
    t, lat, bw = _collective_time.collective_time(fig, "all_gather_into_tensor", nbytes, 4, across_instances=True)
    assert lat == pytest.approx(3 * 10e-6) and bw == pytest.approx(3 / 4 * nbytes / fig["efa_bytes_per_s"])
    inside = _collective_time.collective_time(fig, "all_gather_into_tensor", nbytes, 4)[2]
    assert inside == pytest.approx(3 / 4 * nbytes / fig["link_bytes_per_s"]) and inside < bw
    one_chip = time_model.core_figures("trn1", 1, "trn1.2xlarge")
    with pytest.raises(hw.MissingFigure, match="no EFA figure"):
        _collective_time.collective_time(one_chip, "all_gather_into_tensor", nbytes, 4, across_instances=True)


def test_attention_on_neuron_is_timed_on_the_tensor_engine_with_its_flops():
    # The simulator runs attention as the CPU flash kernel; on a NeuronCore it is matmuls.
    b, h, s, d = 1, 2, 256, 64
    q = torch.randn(b, h, s, d, device="neuron", requires_grad=True)
    with torch_neuronx.readiness() as r:
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    ops = {o.op: o for o in r.recording.buckets[-1].ops}
    fwd = ops["aten::_scaled_dot_product_flash_attention_for_cpu"]
    bwd = ops["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert fwd.kind == bwd.kind == "tensor"
    assert fwd.flops == 2 * (2 * b * h * s * s * d)  # q @ k^T and p @ v
    assert bwd.flops == 5 * (2 * b * h * s * s * d)  # the recomputed scores and four gradient matmuls


def test_dry_run_costs_a_compiled_graph_as_a_real_run_does():
    def run(dry: bool) -> dict:
        torch._dynamo.reset()
        torch.manual_seed(0)
        with torch_neuronx.readiness(dry_run=dry) as r:
            m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(
                "neuron"
            )
            f = torch.compile(m, backend="neuron")
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                f(torch.randn(64, 256, device="neuron")).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        return r.report.data["estimates"][0]

    real, dry = run(False), run(True)
    graphs = [o["op"] for o in dry["ops"] if o["op"].startswith("compiled graph")]
    assert sorted(g.rsplit(" ", 1)[1] for g in graphs) == ["backward", "forward"]
    assert dry["step_seconds"] == pytest.approx(real["step_seconds"], rel=1e-9)
