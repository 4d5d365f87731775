"""The recorder's parts on their own: the storage ledger, the observers, the session's order, the
list of private PyTorch details."""

import collections

import pytest
import torch

import torch_neuronx
from torch_neuronx.readiness import _torch_private
from torch_neuronx.readiness.record.ledger import PEAK_STEP, StorageLedger, StorageRecord
from torch_neuronx.readiness.record.observers.compile import _compile_delta
from torch_neuronx.readiness.record.observers.fallbacks import Fallbacks, WouldBeFallbacks
from torch_neuronx.readiness.record.observers.spans import Spans
from torch_neuronx.readiness.record.recording import MemoryCategory


# -- the ledger -------------------------------------------------------------------------------------
def _rec(nbytes, op="aten::empty", core=0, collective=False):
    return StorageRecord(nbytes, (nbytes,), "uint8", op, core, collective)


def test_ledger_snapshots_only_when_usage_grows_by_the_step():
    ledger = StorageLedger()
    ledger.add("a", _rec(100))
    ledger.note(0)
    assert ledger.snapshots[0].at == 100 and [t.bytes for t in ledger.snapshots[0].top] == [100]
    ledger.add("b", _rec(1))  # 101 < 100 * PEAK_STEP: the snapshot stands
    ledger.note(0)
    assert ledger.snapshots[0].at == 100
    ledger.add("c", _rec(int(100 * PEAK_STEP)))
    ledger.note(0)
    assert ledger.snapshots[0].at == ledger.usage[0] == 101 + int(100 * PEAK_STEP)
    assert [t.bytes for t in ledger.snapshots[0].top] == [102, 100, 1]
    ledger.pop("c")
    assert ledger.usage[0] == 101 and ledger.snapshots[0].at == 203  # the peak's snapshot is kept


def test_ledger_breaks_the_peak_down_by_category():
    ledger = StorageLedger(categorize=lambda: {"w": MemoryCategory.PARAMETERS})
    ledger.add("w", _rec(40))
    ledger.add("buf", _rec(10, op="c10d::allreduce_", collective=True))
    ledger.add("act", _rec(5))
    ledger.note(0)
    snap = ledger.snapshots[0]
    assert snap.breakdown["parameters"] == 40 and snap.breakdown["collective buffers"] == 10
    assert snap.breakdown["activations and temporaries"] == 5 and sum(snap.breakdown.values()) == snap.at
    assert [t.kind for t in snap.top] == ["parameters", "collective buffers", "activations and temporaries"]


def test_ledger_holds_a_real_storage_while_a_tensor_seen_on_it_lives():
    ledger = StorageLedger()
    t = torch.empty(64, dtype=torch.uint8, device="neuron")
    key = t.untyped_storage().data_ptr()
    assert ledger.hold(key, t, "aten::empty") == 64
    view = t[:8]
    assert ledger.hold(key, view, "aten::slice") == 0  # the same storage: nothing new
    del t
    assert key in ledger.live  # the view keeps it
    del view
    assert key not in ledger.live and ledger.usage[0] == 0


# -- observers --------------------------------------------------------------------------------------
def test_spans_count_in_the_step_and_every_open_bucket():
    spans = Spans()
    spans.count_op("a")
    region = spans.open_region("r")
    spans.count_op("a")
    spans._step(None, (), {})
    spans.count_op("b")
    spans.close(region)
    spans.count_op("b")
    assert [dict(b.ops) for b in spans.steps] == [{"a": 2}, {"b": 2}]
    assert dict(region.ops) == {"a": 1, "b": 1} and spans.n_steps == 1


def test_would_be_fallbacks_ask_the_device_once_per_op_and_dtypes():
    fallbacks = Fallbacks(WouldBeFallbacks())
    x = torch.ones(2, device="neuron", dtype=torch.float64)
    for _ in range(3):
        fallbacks.check(torch.ops.aten.cumsum.default, "aten::cumsum", [x], [x], None)
    fallbacks.check(torch.ops.aten.copy_.default, "aten::copy_", [x], [x], None)  # a memory kernel: native
    (f,) = fallbacks.record()
    assert (f.op, f.dtype, f.count) == ("aten::cumsum", "float64", 3) and "float64" in f.reason
    assert len(fallbacks.strategy._cache) == 1


def test_compile_delta_is_the_runs_share_of_dynamos_counters():
    m0 = {
        "graphs": ["g0"],
        "recompilations": [],
        "fallbacks": [],
        "graph_break_reasons": {"x": 1},
        "num_recompilations": 2,
    }
    m1 = {"graphs": ["g0", "g1"], "recompilations": [{"graph": "g1"}], "fallbacks": [],
          "graph_break_reasons": {"x": 3, "y": 1}, "num_recompilations": 5}  # fmt: skip
    breaks = collections.Counter({("... in user code at t.py:7\nGraph Break Reason: x", "t.py:7"): 2})
    c = _compile_delta(m0, m1, breaks, [3, 5])
    assert c.graphs == ["g1"] and c.graph_break_counts == {"x": 2, "y": 1} and c.step_recompilations == [1, 2]
    assert c.graph_breaks == [{"reason": "x", "site": "t.py:7", "count": 2}]


# -- the session ------------------------------------------------------------------------------------
def test_the_session_ends_and_records_the_error_the_block_raised():
    with pytest.raises(RuntimeError, match="boom"):
        with torch_neuronx.readiness() as r:
            torch.ones(2, device="neuron").sum()
            raise RuntimeError("boom")
    assert r.recording.error == "RuntimeError: boom" and "failed on rank 0" in r.report.verdict
    from torch_neuronx.profiler import _graphs
    from torch_neuronx.readiness.record import session as _session

    assert _session.current() is None and _graphs._listener is None  # everything let go


def test_a_dry_run_installs_its_overrides_below_and_removes_them():
    from torch_neuronx._dynamo import backend as compile_backend
    from torch_neuronx.distributed import backend as c10d_backend

    with torch_neuronx.readiness(dry_run=True):
        assert c10d_backend._override is _torch_private.fake_process_group
        assert compile_backend._without_codegen == "dry run"
    assert c10d_backend._override is None and compile_backend._without_codegen is None


# -- private PyTorch details ---------------------------------------------------------------------------
def test_every_private_detail_readiness_relies_on_still_exists():
    assert _torch_private.missing_patch_points() == []
    assert len(_torch_private.PATCH_POINTS) >= 12 and all(p[2] for p in _torch_private.PATCH_POINTS)


def test_a_private_detail_that_went_away_is_named(monkeypatch):
    from torch._subclasses import fake_tensor

    monkeypatch.delattr(fake_tensor.FakeTensorMode, "dispatch")
    assert [p[0] for p in _torch_private.missing_patch_points()] == ["FakeTensorMode.dispatch overridden"]
