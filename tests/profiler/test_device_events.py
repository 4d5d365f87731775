"""torch.profiler on neuron: device events of ops, compiled graphs and
collectives (ProfilerActivity.PrivateUse1) in the Chrome trace and in
key_averages(), linked to the CPU ops that launched them."""

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from helpers import worker_env
from torch_neuronx import _C

WORKERS = Path(__file__).parent / "workers"
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _trace(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def _device_events(events, name_prefix=""):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith(name_prefix)]


def _cpu_op(events, name):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"] == name]


def test_privateuse1_activity_is_supported():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_op_device_events_in_chrome_trace(tmp_path):
    a = torch.randn(128, 128, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        b = a @ a
        c = torch.relu(b)
    torch.testing.assert_close(c.cpu(), torch.relu(a.cpu() @ a.cpu()))
    events = _trace(prof, tmp_path)
    mm = _device_events(events, "aten::mm")
    assert len(mm) == 1, [e["name"] for e in _device_events(events)]
    ev = mm[0]
    assert ev["dur"] > 0
    assert ev["pid"] == 0  # the process of NeuronCore neuron:0
    assert ev["args"]["device"] == "neuron:0"
    # Linked to the CPU op that launched it, and inside its time span.
    cpu = _cpu_op(events, "aten::mm")
    assert len(cpu) == 1
    assert ev["args"]["External id"] == cpu[0]["args"]["External id"]
    assert cpu[0]["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= cpu[0]["ts"] + cpu[0]["dur"] + 1
    assert _device_events(events, "aten::relu")


def test_nested_op_device_event(tmp_path):
    # Ops on nested tensors run on the device like dense ones, and show so.
    nt = torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(4, 6)]).to("neuron")
    with profile(activities=ACTIVITIES) as prof:
        torch.relu(nt)
    events = _trace(prof, tmp_path)
    (ev,) = _device_events(events, "aten::relu")
    assert ev["args"]["device"] == "neuron:0" and ev["dur"] > 0
    # Linked to the op the user called (CPU's nested kernel calls relu on the buffer inside it).
    outer = min(_cpu_op(events, "aten::relu"), key=lambda e: e["ts"])
    assert ev["args"]["External id"] == outer["args"]["External id"]


def test_key_averages_device_columns():
    a = torch.randn(256, 256, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            a @ a
    rows = [e for e in prof.key_averages() if e.key == "aten::mm"]
    cpu = [e for e in rows if e.device_type == DeviceType.CPU]
    dev = [e for e in rows if e.device_type == DeviceType.PrivateUse1]
    assert len(cpu) == 1 and len(dev) == 1
    # The device events have a row, and the CPU ops that launched them are charged their time.
    assert dev[0].count == 3 and dev[0].self_device_time_total > 0
    assert cpu[0].count == 3
    assert cpu[0].device_time_total == pytest.approx(dev[0].device_time_total)
    assert cpu[0].self_device_time_total == pytest.approx(dev[0].self_device_time_total)
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=5)
    assert "NEURON" in table.upper() and "aten::mm" in table


def test_autograd_profiler_use_device_kineto():
    a = torch.randn(128, 128, device="neuron")
    with torch.autograd.profiler.profile(use_device="neuron", use_kineto=True) as prof:
        a @ a
    dev = [e for e in prof.function_events if e.device_type == DeviceType.PrivateUse1]
    assert [e.name for e in dev] == ["aten::mm"] and dev[0].device_time_total > 0
    cpu = [e for e in prof.function_events if e.name == "aten::mm" and e.device_type == DeviceType.CPU]
    assert cpu[0].device_time_total == pytest.approx(dev[0].device_time_total)


def test_autograd_profiler_use_device_legacy_markers():
    # Without kineto the profiler times each op with the device's event stubs.
    a = torch.randn(128, 128, device="neuron")
    with torch.autograd.profiler.profile(use_device="neuron", use_kineto=False) as prof:
        a @ a
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == 1 and mm[0].device_time_total > 0
    assert mm[0].device_time_total <= mm[0].cpu_time_total * 1.01 + 1


def test_cpu_only_profile_has_no_device_events(tmp_path):
    a = torch.randn(64, 64, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ a
    assert not _C._device_tracing()
    events = _trace(prof, tmp_path)
    assert _cpu_op(events, "aten::mm")
    assert not _device_events(events)


def test_tracing_flag_only_during_profile():
    assert not _C._device_tracing()
    with profile(activities=ACTIVITIES):
        assert _C._device_tracing()
    assert not _C._device_tracing()


@pytest.mark.slow  # compiles a graph
def test_compiled_graph_device_event(tmp_path, fresh_dynamo):
    def f(x, w):
        return torch.tanh(x @ w) * 2 + 1

    fn = torch.compile(f, backend="neuron")
    x = torch.randn(32, 64, device="neuron")
    w = torch.randn(64, 16, device="neuron")
    fn(x, w)  # compile outside the profile
    with profile(activities=ACTIVITIES) as prof:
        out = fn(x, w)
    torch.testing.assert_close(out.cpu(), f(x.cpu(), w.cpu()), rtol=1e-4, atol=1e-4)
    events = _trace(prof, tmp_path)
    graphs = _device_events(events, "neuron graph ")
    assert len(graphs) == 1, [e["name"] for e in _device_events(events)]
    g = graphs[0]
    assert g["name"].endswith(" forward") and g["dur"] > 0
    assert g["args"]["kind"] == "compiled graphs"
    # The ops the graph runs are inside the graph's event, not events of their own.
    assert not _device_events(events, "aten::")
    rows = [e for e in prof.key_averages() if e.key == g["name"]]
    assert len(rows) == 1 and rows[0].device_time_total > 0


def test_collective_device_event_single_rank(tmp_path):
    store = dist.HashStore()
    dist.init_process_group("neuron", rank=0, world_size=1, store=store, timeout=datetime.timedelta(seconds=30))
    try:
        t = torch.ones(1024, device="neuron")
        with profile(activities=ACTIVITIES) as prof:
            dist.all_reduce(t)
        events = _trace(prof, tmp_path)
    finally:
        dist.destroy_process_group()
    coll = _device_events(events, "c10d::allreduce_")
    assert len(coll) == 1 and coll[0]["dur"] > 0
    assert coll[0]["args"]["kind"] == "collectives"


@pytest.mark.multiprocess
def test_collective_device_events_two_ranks(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKERS / "profile_collectives.py"),
        str(tmp_path),
    ]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    for rank in range(2):
        events = json.loads((tmp_path / f"trace_rank{rank}.json").read_text())["traceEvents"]
        coll = _device_events(events, "c10d::allreduce_")
        assert len(coll) == 2, [e["name"] for e in _device_events(events)]
        assert all(e["dur"] > 0 and e["pid"] == rank for e in coll)  # rank r owns neuron:r
        assert _device_events(events, "c10d::_allgather_base_") or _device_events(events, "c10d::allgather_")
