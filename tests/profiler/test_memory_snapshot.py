"""torch.neuron.memory._record_memory_history / _snapshot / _dump_snapshot:
CUDA-format snapshots that PyTorch's own memory visualizer reads, with the
Python stacks of allocations."""

import pickle

import pytest
import torch
from torch.cuda import _memory_viz

MEM = torch.neuron.memory


@pytest.fixture
def recording():
    MEM._record_memory_history(enabled="all", context="all", stacks="python", clear_history=True)
    yield
    MEM._record_memory_history(enabled=None)


def _frames_named(frames, name):
    return any(f["name"] == name and f["filename"].endswith("test_memory_snapshot.py") for f in frames)


def allocate_activations():
    return torch.empty(3000, 1000, device="neuron")  # 12 MB


def allocate_and_free():
    t = torch.empty(5000, device="neuron")
    addr = t.data_ptr()
    del t
    return addr


def test_snapshot_has_allocations_with_python_frames(recording):
    keep = allocate_activations()
    snap = MEM._snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    blocks = [(s, b) for s in snap["segments"] for b in s["blocks"] if b["address"] == keep.data_ptr()]
    assert len(blocks) == 1
    seg, blk = blocks[0]
    assert blk["state"] == "active_allocated" and blk["requested_size"] == 12_000_000
    assert blk["size"] >= blk["requested_size"] and seg["total_size"] == blk["size"]
    assert seg["device"] == 0 and seg["stream"] == 0
    assert _frames_named(blk["frames"], "allocate_activations")
    assert _frames_named(blk["frames"], "test_snapshot_has_allocations_with_python_frames")


def test_trace_records_alloc_and_free(recording):
    addr = allocate_and_free()
    trace = MEM._snapshot()["device_traces"][0]
    mine = [e for e in trace if e["addr"] == addr]
    assert [e["action"] for e in mine] == ["alloc", "free_requested", "free_completed"]
    assert all(e["size"] == 5000 * 4 and e["stream"] == 0 and e["time_us"] > 0 for e in mine)
    assert _frames_named(mine[0]["frames"], "allocate_and_free")
    assert mine[0]["time_us"] <= mine[1]["time_us"]


def test_memory_viz_reads_dumped_snapshot(recording, tmp_path):
    MEM.empty_cache()  # the tensor below then gets a new segment
    before = MEM._snapshot()
    keep = allocate_activations()
    allocate_and_free()
    path = tmp_path / "snap.pickle"
    MEM._dump_snapshot(str(path))
    snap = pickle.loads(path.read_bytes())

    summary = _memory_viz.segsum(snap)
    assert f"segments: {len(snap['segments'])}\n" in summary
    trace_text = _memory_viz.trace(snap)
    assert f"{len(snap['device_traces'][0])} entries" in trace_text
    assert "del " in trace_text and "# free completed for" in trace_text
    lines = _memory_viz.memory(snap, format_flamegraph=lambda s: s)
    assert "allocate_activations" in lines
    assert "allocate_activations" in _memory_viz.segments(snap, format_flamegraph=lambda s: s)
    diff = _memory_viz.compare(before["segments"], snap["segments"], format_flamegraph=lambda s: s)
    assert "only_after" in diff and "allocate_activations" in diff
    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap)):
        assert html.lstrip().startswith("<!DOCTYPE html>") or "<html" in html
    del keep


def test_cached_blocks_are_inactive_segments(recording):
    addr = allocate_and_free()  # 20 kB: the freed block stays cached
    snap = MEM._snapshot()
    cached = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == addr]
    assert cached and cached[0]["state"] == "inactive" and cached[0]["requested_size"] == 0
    MEM.empty_cache()
    snap = MEM._snapshot()
    assert not [b for s in snap["segments"] for b in s["blocks"] if b["address"] == addr]


def test_state_only_keeps_no_trace():
    MEM._record_memory_history(enabled="state", stacks="python", clear_history=True)
    try:
        keep = allocate_activations()
        allocate_and_free()
        snap = MEM._snapshot()
    finally:
        MEM._record_memory_history(enabled=None)
    assert all(len(t) == 0 for t in snap["device_traces"])
    blk = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == keep.data_ptr()][0]
    assert _frames_named(blk["frames"], "allocate_activations")


def test_not_recording_records_nothing():
    MEM._record_memory_history(enabled=None)
    keep = allocate_activations()
    snap = MEM._snapshot()
    assert all(len(t) == 0 for t in snap["device_traces"])
    blk = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == keep.data_ptr()][0]
    assert blk["state"] == "active_allocated" and blk["frames"] == []


def test_max_entries_keeps_the_latest(recording):
    MEM._record_memory_history(enabled="all", stacks="python", max_entries=3, clear_history=True)
    for _ in range(4):
        allocate_and_free()
    trace = MEM._snapshot()["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed"]


def test_free_of_allocation_made_before_recording():
    MEM._record_memory_history(enabled=None)
    t = torch.empty(777, device="neuron")
    addr = t.data_ptr()
    MEM._record_memory_history(enabled="all", stacks="python", clear_history=True)
    try:
        del t
        trace = MEM._snapshot()["device_traces"][0]
    finally:
        MEM._record_memory_history(enabled=None)
    mine = [e for e in trace if e["addr"] == addr]
    assert [e["action"] for e in mine] == ["free_requested", "free_completed"]
    assert mine[0]["size"] == 777 * 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"enabled": "yes"}, "enabled must be one of"),
        ({"context": "stack"}, "context must be one of"),
        ({"stacks": "cpp"}, "stacks must be one of"),
        ({"max_entries": 0}, "max_entries must be a positive int"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MEM._record_memory_history(**kwargs)


def test_bad_device():
    with pytest.raises(IndexError, match="Invalid device index"):
        MEM._snapshot(device=99)
