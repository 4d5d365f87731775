"""The estimates of AWS's published training figures (benchmarks/published.py), pinned.

Each configuration's recording at real size (written by ``python benchmarks/published.py
--save DIR``; copied to tests/readiness/data/published_<row>.json, or .json.gz compressed) is
estimated again here, so that a change to the time model or the hardware table that moves a
row is seen: update the pin and the table in docs/benchmarks.md together. The model terms the
rows need (the pipeline schedule, collectives between instances, attention on the Tensor Engine,
compiled graphs in a dry run) are checked against values computed here.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
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
BERT2 = _known_error.row("BERT-Large phase-2 pre-training, 16 x trn1.32xlarge, DP=512")
BERT2_MFU = 0.1704
LLAMA = _known_error.row("Llama-3.1-70B pre-training, 32 x trn1.32xlarge, TP=32 x PP=8 x DP=4")
LLAMA_MFU = 0.3605


def _recording(name: str):
    path = DATA / f"published_{name}.json"
    return published.load(path if path.exists() else path.with_suffix(".json.gz"))


# -- the rows -----------------------------------------------------------------------------
def test_bert_large_phase1_on_trn1_32xlarge_is_pinned():
    row = published.bert_row(_recording("bert"))
    assert (row["aws"], row["unit"]) == (BERT.aws, BERT.unit) == (3826.6, "seq/s")
    assert row["estimate"] == pytest.approx(BERT.estimate, rel=1e-3)
    assert row["ratio"] == pytest.approx(row["estimate"] / 3826.6)
    assert row["mfu"] == pytest.approx(BERT_MFU, rel=1e-3)


def test_bert_large_phase2_on_16_trn1_32xlarge_is_pinned():
    raws = _recording("bert2")
    row = published.bert2_row(raws)
    assert (row["aws"], row["unit"]) == (BERT2.aws, BERT2.unit) == (7507.0, "seq/s")
    assert row["estimate"] == pytest.approx(BERT2.estimate, rel=1e-3)
    assert row["ratio"] == pytest.approx(row["estimate"] / 7507.0)
    assert row["mfu"] == pytest.approx(BERT2_MFU, rel=1e-3)
    # rank 0 of 512 with 32 ranks per instance: the gradient all-reduce (AWS's 512 MiB buckets of
    # the fp32 gradients) spans the 16 instances, so the estimate times it over EFA
    (rec,) = raws
    assert (rec.rank, rec.world_size) == (0, 512)
    calls = rec.region("all-reduce and optimizer step").collectives
    assert {(c.kind, c.group_size, c.instances) for c in calls} == {("allreduce", 512, 16)}
    assert max(c.bytes for c in calls) >= 512 << 20 and len(calls) == 3
    assert not rec.region("accumulating micro-batch").collectives


def test_llama31_70b_on_32_trn1_32xlarge_is_pinned():
    # examples/llama_3d.py's dry run of the 1,024 ranks: one recording per rank class, each with its size
    raws = _recording("llama70b")
    assert len(raws) == 16 and sum(r.extra["class_size"] for r in raws) == 1024
    assert {r.world_size for r in raws} == {1024} and sorted(r.rank for r in raws)[:2] == [0, 31]
    assert {r.pipeline.schedule for r in raws} == {"Schedule1F1B"}
    row = published.llama_row(raws)
    assert (row["aws"], row["unit"]) == (LLAMA.aws, LLAMA.unit) == (7.94, "seq/s")
    assert row["estimate"] == pytest.approx(LLAMA.estimate, rel=1e-3)
    assert row["mfu"] == pytest.approx(LLAMA_MFU, rel=1e-3)


def test_every_row_has_the_keys_the_table_merges_on():
    import published_inference

    keys = {"figure", "configuration", "kind", "chip", "tp", "aws", "estimate", "unit", "ratio", "mfu"}
    eager = published_inference.recording(str(DATA / "llama405b_tp64_raw.json"))
    compiled = published_inference.recording(str(DATA / "llama405b_tp64_compiled.json"))
    rows = [published.bert_row(_recording("bert")), published.bert2_row(_recording("bert2"))]
    rows += [published.llama_row(_recording("llama70b"))]
    rows += [f(eager) for f in published_inference.EAGER_ROWS]  # these add what dominates each phase
    rows += [f(compiled) for f in published_inference.COMPILED_ROWS]
    for run, fs in published_inference.TRN1_ROWS.items():
        raws = published_inference.recording(str(DATA / f"{run}_trn1_tp32.json"))
        rows += [f(raws) for f in fs]
    n = len(_known_error.ROWS)
    assert [sorted(keys - set(r)) for r in rows] == [[]] * n == [[]] * 11
    # the rows are the known-error table's, from which reports print the model's error
    known = _known_error.ROWS
    # (the inference rows print their estimate to 0.1 ms)
    assert [r["estimate"] for r in rows] == pytest.approx([k.estimate for k in known], rel=1e-3, abs=0.05)
    assert [(r["kind"], r["chip"], r["tp"]) for r in rows] == [(k.kind, k.chip, k.tp) for k in known]
    table = published.to_markdown(rows).splitlines()
    n = len(known)
    assert table[0] == "| configuration | AWS | estimate | ratio | time error | implied MFU | within 10% |"
    assert len(table) == 2 + n + 2 + 3 + n
    assert table[2].startswith("| BERT-Large phase-1 pre-training throughput: trn1.32xlarge, DP=32")
    assert table[3].startswith("| BERT-Large phase-2 pre-training throughput: 16 x trn1.32xlarge, DP=512")
    assert table[6].startswith("| Llama-3.1-405B inference: time per output token")
    assert table[9].startswith("| Llama-3-70B inference: time to first token: trn1.32xlarge, TP=32")
    assert table[12].startswith("| Llama-2-13b inference: time per output token: trn1.32xlarge, TP=32")
    # BERT: 3,826.6 seq/s measured, 3,630.1 estimated: the step takes 3826.6 / 3630.1 - 1 = +5.4% longer
    assert "| 0.95 | +5.4% |" in table[2] and table[2].endswith("| yes |")
    errors = [abs(k.time_error) for k in known]
    within = sum(e <= 0.10 for e in errors)
    assert table[n + 3] == (
        f"Mean absolute error of the estimated time {sum(errors) / n:.1%}; {within} of {n} rows within 10%."
    )
    # leave one out: each row against the band the other rows of its kind give
    loo = table[table.index("Leave one out (the band the other rows of a row's kind give it):") + 2 :]
    assert len(loo) == n
    bert, bert2 = known[0].time_error, known[1].time_error  # training at TP <= 8: the two BERT rows
    assert loo[0] == f"- {rows[0]['figure']}: {bert2:+.1%} to {bert2:+.1%}; its own {bert:+.1%} is " + (
        "inside" if bert == bert2 else "outside"
    )
    # the eager 405B decode step against the compiled one and the two on trn1
    others = sorted((known[6].time_error, known[8].time_error, known[10].time_error))
    others = [others[0], others[-1]]
    tpot = known[4].time_error
    where = "inside" if others[0] <= tpot <= others[1] else "outside"
    assert loo[4] == f"- {rows[4]['figure']}: {others[0]:+.1%} to {others[1]:+.1%}; its own {tpot:+.1%} is {where}"


def test_leave_one_out_and_the_bands_group_rows_by_kind_and_tensor_parallel_degree():
    Row = _known_error.PublishedRow
    rows = (
        Row("a", "training", "trn1", 100.0, 110.0, "seq/s", 8),  # time -9.1%
        Row("b", "training", "trn1", 100.0, 95.0, "seq/s", 4),  # time +5.3%
        Row("c", "training", "trn1", 10.0, 8.0, "seq/s", 32),  # time +25%
        Row("d", "decode", "trn2", 40.0, 42.0, "ms", 64),  # time +5%
    )
    (a, span_a, in_a), (b, span_b, in_b), (c, span_c, _), (d, span_d, _) = _known_error.leave_one_out(rows)
    assert span_a == pytest.approx((100 / 95 - 1,) * 2) and not in_a
    assert span_b == pytest.approx((100 / 110 - 1,) * 2) and not in_b
    assert span_c is None and span_d is None  # alone in their kind (TP above 8 is a kind of its own)
    assert _known_error.mean_absolute_error(rows) == pytest.approx((1 / 11 + 5 / 95 + 0.25 + 0.05) / 4)
    assert _known_error.band("training", 8, rows) == (
        "training steps at TP <= 8: estimated time -9% to +5% off AWS's measured (2 published rows, trn1)"
    )
    assert _known_error.band("training", 64, rows).startswith("training steps at TP > 8: estimated time +25% off")
    assert _known_error.band("prefill", rows=rows).endswith(
        "no published figure of this kind of run; the estimate's error is unknown"
    )


# -- the model terms they need ----------------------------------------------------------------
def test_pipeline_is_1f1b_sum_of_stages_plus_slowest_for_the_other_micro_batches():
    assert time_model.pipeline_seconds([1.0] * 8, 256) == 256 + 8 - 1  # M + P - 1 slots
    assert time_model.pipeline_seconds([1.0, 2.0, 1.0], 4) == 1 + 2 + 1 + 3 * 2
    with pytest.raises(ValueError, match="at least one stage and one micro-batch"):
        time_model.pipeline_seconds([1.0], 0)


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
