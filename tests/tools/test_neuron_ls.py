"""neuron-ls: table and JSON output for the simulated instance, env handling, errors."""

import json
import os
import subprocess
import sys

import pytest
import torch  # noqa: F401  (first: see the note on LAUNCH below)

from torch_neuronx.tools import neuron_ls

ENV_VARS = (
    "TORCH_NEURONX_INSTANCE_TYPE",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
)

LAUNCH = [sys.executable, "-m", "torch_neuronx.tools.neuron_ls"]


def run_ls(*args, launch=LAUNCH, **env):
    e = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    e.update(env)
    return subprocess.run([*launch, *args], env=e, capture_output=True, text=True, timeout=120)


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table_rows(out):
    """Data rows of the table: lists of cell strings."""
    lines = [l for l in out.splitlines() if l.startswith("|")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]


def test_default_table():
    out = ok(run_ls())
    assert "instance-type: trn2.3xlarge" in out
    assert "simulated" in out
    assert "logical-neuroncore-config: 2" in out
    for header in ("NEURON", "DEVICE", "CORES", "CORE IDS", "MEMORY", "PHYSICAL"):
        assert header in out
    rows = table_rows(out)
    assert rows == [["0", "4", "0-3", "0-7", "0-3", "96 GB", "0 B"]]


def test_default_json():
    devices = json.loads(ok(run_ls("--json")))
    assert isinstance(devices, list) and len(devices) == 1
    d = devices[0]
    assert d["neuron_device"] == 0
    assert d["nc_count"] == 4
    assert d["neuroncore_ids"] == [0, 1, 2, 3]
    assert d["physical_neuroncore_ids"] == list(range(8))
    assert d["logical_neuroncore_config"] == 2
    assert d["memory_size"] == 96 * 2**30
    assert d["memory_used"] == 0
    assert d["instance_type"] == "trn2.3xlarge"
    assert d["simulated"] is True


def test_visible_cores_subset():
    out = ok(run_ls(NEURON_RT_VISIBLE_CORES="1,3"))
    assert "visible-neuroncores: 2 of 4 (1,3)" in out
    assert "NEURON_RT_VISIBLE_CORES=1,3" in out
    assert table_rows(out) == [["0", "2", "1,3", "2-3,6-7", "0-1", "96 GB", "0 B"]]
    (d,) = json.loads(ok(run_ls("--json", NEURON_RT_VISIBLE_CORES="1,3")))
    assert d["nc_count"] == 2
    assert d["neuroncore_ids"] == [1, 3]
    assert d["torch_device_indices"] == [0, 1]


def test_lnc1_shows_eight_cores():
    (d,) = json.loads(ok(run_ls("-j", NEURON_LOGICAL_NC_CONFIG="1")))
    assert d["nc_count"] == 8
    assert d["neuroncore_ids"] == list(range(8))
    assert d["logical_neuroncore_config"] == 1


def test_trn2_48xlarge():
    itype = "trn2.48xlarge"
    devices = json.loads(ok(run_ls("-j", TORCH_NEURONX_INSTANCE_TYPE=itype)))
    assert len(devices) == 16
    assert sum(d["nc_count"] for d in devices) == 64
    assert [d["neuron_device"] for d in devices] == list(range(16))
    assert devices[5]["neuroncore_ids"] == [20, 21, 22, 23]
    assert all(d["instance_type"] == itype for d in devices)
    out = ok(run_ls(TORCH_NEURONX_INSTANCE_TYPE=itype))
    assert f"instance-type: {itype}" in out
    assert "visible-neuroncores: 64 of 64 (0-63)" in out
    rows = table_rows(out)
    assert len(rows) == 16
    assert rows[15][:3] == ["15", "4", "60-63"]


def test_devices_without_visible_cores_are_omitted():
    devices = json.loads(
        ok(run_ls("-j", TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge", NEURON_RT_VISIBLE_CORES="2-5,63"))
    )
    assert [(d["neuron_device"], d["neuroncore_ids"]) for d in devices] == [
        (0, [2, 3]),
        (1, [4, 5]),
        (15, [63]),
    ]


@pytest.mark.parametrize(
    "args, env, var",
    [
        ((), {"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG"),
        (("--json",), {"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG"),
        ((), {"NEURON_RT_VISIBLE_CORES": "7"}, "NEURON_RT_VISIBLE_CORES"),
        ((), {"NEURON_RT_VISIBLE_CORES": "a-b"}, "NEURON_RT_VISIBLE_CORES"),
        ((), {"TORCH_NEURONX_INSTANCE_TYPE": "p5.48xlarge"}, "TORCH_NEURONX_INSTANCE_TYPE"),
    ],
)
def test_invalid_configuration_exits_1(args, env, var):
    proc = run_ls(*args, **env)
    assert proc.returncode == 1
    assert var in proc.stderr
    assert "error" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_import_torch_neuronx_first_then_tool():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch_neuronx, sys; from torch_neuronx.tools.neuron_ls import main;" " sys.exit(main([]))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "instance-type:" in proc.stdout


def test_format_helpers():
    assert neuron_ls.format_ids([0, 1, 2, 3]) == "0-3"
    assert neuron_ls.format_ids([3, 1]) == "1,3"
    assert neuron_ls.format_ids([0, 1, 4, 6, 7]) == "0-1,4,6-7"
    assert neuron_ls.format_bytes(96 * 2**30) == "96 GB"
    assert neuron_ls.format_bytes(0) == "0 B"
    assert neuron_ls.format_bytes(1536 * 2**20) == "1.5 GB"


def test_memory_used_in_process():
    """Called inside a process that holds device memory, the table shows it."""

    x = torch.empty(1 << 20, dtype=torch.float32, device="neuron:0")
    data = neuron_ls.collect()
    (dev,) = [d for d in data["devices"] if 0 in d["torch_device_indices"]]
    assert dev["memory_used"] >= x.numel() * x.element_size()
    del x
