"""Storage operations keep the device (resize to 0 and back, set_, copies,
shared memory) with the allocator's statistics right; FSDP1, which frees and
regathers parameters that way, trains on 2 ranks as on CPU; legacy type
objects; bounded configuration parsing."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers import run_python, worker_env

DEVICE = "neuron"
warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")


def test_storage_resize_to_zero_and_back_stays_on_device():
    t = torch.arange(256.0, device=DEVICE)
    before = torch.neuron.memory_allocated()
    s = t.untyped_storage()
    nbytes = s.nbytes()
    s.resize_(0)
    assert s.device == t.device and s.nbytes() == 0
    assert torch.neuron.memory_allocated() == before - nbytes
    s.resize_(nbytes)
    assert s.device == t.device and s.nbytes() == nbytes
    assert torch.neuron.memory_allocated() == before
    t.copy_(torch.arange(256.0))
    assert torch.equal(t.cpu(), torch.arange(256.0))


def test_set_after_resize_to_zero():
    t = torch.ones(4, device=DEVICE)
    t.untyped_storage().resize_(0)
    src = torch.arange(4.0, device=DEVICE)
    t.set_(src.untyped_storage(), 0, (4,), (1,))
    assert t.device == src.device and torch.equal(t.cpu(), torch.arange(4.0))
    empty = torch.ones(3, device=DEVICE).set_()
    assert empty.device.type == DEVICE and empty.untyped_storage().device.type == DEVICE


def test_storage_copies_and_share_memory_stay_on_device():
    t = torch.arange(6.0, device=DEVICE)
    assert t.untyped_storage().clone().device == t.device
    c = torch.UntypedStorage(t.untyped_storage().nbytes(), device=DEVICE)
    c.copy_(t.untyped_storage())
    assert c.device == t.device
    assert torch.equal(torch.tensor([], device=DEVICE).set_(c).view(torch.float32).cpu(), torch.arange(6.0))
    assert t.share_memory_().device == t.device
    assert t.untyped_storage().cpu().device.type == "cpu"


# --- legacy type objects -------------------------------------------------------

LEGACY = [
    ("FloatTensor", "FloatStorage", torch.float32),
    ("DoubleTensor", "DoubleStorage", torch.float64),
    ("HalfTensor", "HalfStorage", torch.float16),
    ("BFloat16Tensor", "BFloat16Storage", torch.bfloat16),
    ("LongTensor", "LongStorage", torch.int64),
    ("IntTensor", "IntStorage", torch.int32),
    ("ShortTensor", "ShortStorage", torch.int16),
    ("CharTensor", "CharStorage", torch.int8),
    ("ByteTensor", "ByteStorage", torch.uint8),
    ("BoolTensor", "BoolStorage", torch.bool),
]


@pytest.mark.parametrize("tname,sname,dtype", LEGACY, ids=[t for t, _, _ in LEGACY])
def test_legacy_types(tname, sname, dtype):
    ttype, stype = getattr(torch.neuron, tname), getattr(torch.neuron, sname)
    x = torch.zeros(3, dtype=dtype, device=DEVICE)
    assert x.type() == f"torch.neuron.{tname}"
    assert isinstance(x, ttype)
    assert not isinstance(x.cpu(), ttype)
    assert not isinstance(x, torch.neuron.FloatTensor if dtype != torch.float32 else torch.neuron.LongTensor)
    assert x.storage_type() is stype
    assert stype.dtype == dtype
    y = torch.ones(2, device=DEVICE).type(ttype)
    assert y.dtype == dtype and y.device.type == DEVICE
    assert repr(ttype) == f"<class 'torch.neuron.{tname}'>"
    s = stype(4)
    assert s.device.type == DEVICE and s.dtype == dtype and s.size() == 4
    made = ttype(2, 3)
    assert made.shape == (2, 3) and made.dtype == dtype and made.device.type == DEVICE


def test_legacy_complex_storages_and_data_constructor():
    assert torch.zeros(2, dtype=torch.complex64, device=DEVICE).storage_type() is torch.neuron.ComplexFloatStorage
    assert torch.neuron.ComplexDoubleStorage.dtype == torch.complex128
    assert torch.equal(torch.neuron.LongTensor([1, 2]).cpu(), torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="takes sizes"):
        torch.neuron.FloatTensor(2, "a")


# --- configuration parsing is bounded --------------------------------------------


# Before the bounds check, "0-2147483647" spent seconds and gigabytes, then
# ended in std::bad_alloc. (The runtime's C++ tests cover the parser itself.)
@pytest.mark.parametrize("value", ["0-2147483647", "99999999999999", "3,1000000"])
def test_visible_cores_out_of_range_rejected(value):
    p = run_python("import torch; torch.ones(1, device='neuron')", env={"NEURON_RT_VISIBLE_CORES": value}, timeout=240)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: NEURON_RT_VISIBLE_CORES="), p.stderr[-2000:]
    assert re.search(r"out of range|names core \d+, but", last), last


# --- FSDP1 on 2 ranks equals CPU (gloo) --------------------------------------------

WORKER = Path(__file__).parent / "workers" / "fsdp1_worker.py"


def _fsdp1_run(device_type, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        device_type,
        str(tmp_path / f"{device_type}.pt"),
    ]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    lines = sorted(l for l in p.stdout.splitlines() if l.startswith("RANK "))
    assert len(lines) == 8, p.stdout
    return lines


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fsdp1_wraps_trains_saves_reloads_like_cpu(tmp_path):
    assert _fsdp1_run(DEVICE, tmp_path) == _fsdp1_run("cpu", tmp_path)
