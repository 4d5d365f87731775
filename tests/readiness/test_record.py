"""The typed recording: what the recorder writes, the time model and the report read, and JSON keeps."""

import json
from pathlib import Path

import pytest
import torch

import torch_neuronx
from torch_neuronx.readiness import Recording, region
from torch_neuronx.readiness.record.recording import VERSION, Bucket, CollectiveCall, OpCall

DATA = Path(__file__).parent / "data"


def _train(steps=2):
    m = torch.nn.Linear(32, 32).to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(steps):
        m(torch.randn(4, 32, device="neuron")).sum().backward()
        opt.step()
        opt.zero_grad()


def test_a_recording_survives_json_with_its_types():
    with torch_neuronx.readiness() as r:
        _train()
        torch.ones(3, device="neuron", dtype=torch.float64).cumsum(0)  # a fallback
    rec = r.recording
    back = Recording.from_json(rec.to_json())
    assert back.to_json() == rec.to_json()
    assert json.loads(rec.to_json())["version"] == VERSION
    assert back.steps == 2 and len(back.buckets) == 3
    mm = [k for k in back.buckets[0].ops if k.op == "aten::addmm"]
    assert mm and isinstance(mm[0], OpCall) and mm[0].flops == 2 * 4 * 32 * 32
    assert {f.op for f in back.fallbacks} == {"aten::ones", "aten::cumsum"}  # float64: not native
    assert [(f.op, f.count) for f in back.fallbacks] == [(f.op, f.count) for f in rec.fallbacks]
    (core,) = back.memory
    assert back.memory[core].peak_allocated == rec.memory[core].peak_allocated > 0


@pytest.mark.parametrize("reset", ["torch.neuron", "torch.accelerator"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry"])
def test_a_scripts_reset_of_the_peak_counters_does_not_hide_its_peak(dry_run, reset):
    """torchtitan resets the peak memory counters after every logged step: the recording's peak is
    still the run's (a dry run of its Llama-3.1-70B at TP 8 x PP 8 reported 2.13 GiB on stage 0,
    whose usage reached 14.73 GiB in the step), whichever module the script resets them through."""
    reset_peaks = {"torch.neuron": torch.neuron, "torch.accelerator": torch.accelerator}[reset].reset_peak_memory_stats
    with torch_neuronx.readiness(dry_run=dry_run) as r:
        x = torch.empty(1 << 26, device="neuron")  # 256 MiB
        y = x + 1
        del x, y
        reset_peaks(0)
        torch.ones(1 << 10, device="neuron").mul_(2)
    (m,) = r.recording.memory.values()
    assert m.peak_allocated >= 2 * (1 << 28) and m.peak_reserved >= m.peak_allocated
    assert torch.neuron.max_memory_allocated() < 1 << 28  # the script's own reading stays its own


def test_pinned_recordings_of_the_first_layout_load():
    """Recordings saved before the typed layout (positional rows) load as the same records."""
    rec = Recording.from_json((DATA / "llama405b_tp64_v1.json").read_text())
    prefill, *decodes = rec.generation.forwards
    assert prefill.phase == "prefill" and prefill.tokens == 10_240 and {d.phase for d in decodes} == {"decode"}
    assert CollectiveCall("reduce_scatter_base", "bfloat16", 335544320, 64) in prefill.collectives
    assert rec.extra["layers"] == 126  # a benchmark's own key, kept
    # and they say so when they come from a newer version than this one reads
    with pytest.raises(ValueError, match="newer than this torch-neuronx reads"):
        Recording.from_json({"version": VERSION + 1})


def test_recordings_of_version_2_load_without_the_tiles():
    """Version 2 had no tile_flops: its matmuls load with 0 (timed at their FLOPs)."""
    with torch_neuronx.readiness() as r:
        torch.ones(4, 8, device="neuron") @ torch.ones(8, 4, device="neuron")
    d = json.loads(r.recording.to_json())
    assert d["version"] == VERSION == 5
    d["version"] = 2
    for b in d["buckets"]:
        for o in b["ops"]:
            o.pop("tile_flops", None)
            o.pop("matmuls", None)
    (mm,) = [c for c in Recording.from_json(d).buckets[-1].ops if c.op == "aten::mm"]
    assert mm.tile_flops == 0 and mm.matmuls == () and mm.flops == 2 * 4 * 8 * 4


def test_recordings_of_version_3_load_with_every_collective_waited_for():
    """Version 3 had no `asynchronous`: its collectives load as waited for where issued, as the
    time model charged every collective then."""
    rec = Recording.from_json((DATA / "llama405b_tp64_raw.json").read_text())
    assert json.loads((DATA / "llama405b_tp64_raw.json").read_text())["version"] == 3
    colls = [c for b in rec.generation.forwards for c in b.collectives]
    assert colls and not any(c.asynchronous for c in colls)


def test_regions_count_what_runs_inside_them_besides_the_step():
    with torch_neuronx.readiness() as r:
        x = torch.ones(8, device="neuron")
        with region("twice"):
            x.add(1)
            with region("inner"):
                x.mul(2)
        with region("twice"):
            x.add(1)
    rec = r.recording
    assert [b.name for b in rec.regions] == ["twice", "inner", "twice"]
    ops = lambda b: sorted(k.op for k, n in b.ops.items() for _ in range(n))  # noqa: E731
    assert ops(rec.regions[0]) == ["aten::add.Tensor", "aten::mul.Tensor"]
    assert ops(rec.regions[1]) == ["aten::mul.Tensor"] and ops(rec.region("twice")) == ops(rec.regions[0])
    assert ops(rec.buckets[0]).count("aten::add.Tensor") == 2  # the step's bucket counts them all
    with pytest.raises(KeyError, match="no region 'missing'"):
        rec.region("missing")


def test_a_region_outside_a_recording_does_nothing():
    with region("nothing records"):
        assert torch.ones(2, device="neuron").sum().item() == 2.0


def test_the_time_model_estimates_a_region_as_a_report_does_a_step():
    from torch_neuronx.readiness import TimeModel

    with torch_neuronx.readiness() as r:
        with region("step"):
            _train(steps=1)
    rec = r.recording
    model = TimeModel("trn2", 2)
    est = model.bucket(rec, rec.region("step"))
    assert est.seconds == pytest.approx(model.bucket(rec, rec.buckets[0]).seconds)
    assert est.seconds == pytest.approx(r.report.data["estimates"][0]["step_seconds"])
    # the forward's matmul and the weight gradient's (the input needs none)
    assert est.tensor_flops["float32"] == 2 * (2 * 4 * 32 * 32)


def test_bucket_keys_become_records():
    b = Bucket()
    b.ops[("aten::mm", "float32", "tensor", 8, 4, 3, 16)] += 2
    (k,) = b.typed().ops
    assert k == OpCall("aten::mm", "float32", "tensor", 8, 4, 3, 16) and k.bytes == 4 and b.typed().ops[k] == 2
