"""import torch alone registers the device (torch.backends entry point)."""

import torch

from helpers import run_python


def test_plain_import_torch_registers_neuron():
    r = run_python(
        "import torch, sys\n"
        "assert 'torch_neuronx' in sys.modules\n"
        "print(torch.neuron.is_available(), torch.accelerator.current_accelerator(), "
        "torch._C._get_privateuse1_backend_name())"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "neuron", "neuron"]


def test_generated_methods():
    t = torch.ones(2)
    n = t.neuron()
    assert n.is_neuron and n.device == torch.device("neuron", torch.neuron.current_device())
    assert not t.is_neuron
    m = torch.nn.Linear(2, 2).neuron()
    assert m.weight.is_neuron
    assert torch.ones(1).untyped_storage().neuron().device.type == "neuron"


def test_device_strings():
    for spec in ("neuron", "neuron:1", torch.device("neuron", 2)):
        t = torch.zeros(2, device=spec)
        assert t.device.type == "neuron"
    assert torch.zeros(1, device="neuron:3").device.index == 3


def test_public_exports():
    import torch_neuronx

    for name in (
        "Stream",
        "Event",
        "get_fallback_ops",
        "get_executed_ops",
        "clear_op_tracking",
        "is_neuron_runtime_initialized",
    ):
        assert hasattr(torch_neuronx, name), name


def test_hf_detection_paths():
    """transformers / accelerate / kernels / diffusers detect the device unpatched."""
    r = run_python(
        "import importlib.util, importlib.metadata, torch\n"
        "from transformers.utils import is_torch_neuron_available\n"
        "assert importlib.util.find_spec('torch_neuronx')\n"
        "assert importlib.metadata.version('torch-neuronx')\n"
        "print(is_torch_neuron_available())\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("True")


def test_exit_waits_until_autograds_device_threads_have_let_go_of_python():
    """Autograd's device thread holds a Python thread state; at exit it must be gone before
    Python finalises (a thread that re-takes the GIL then aborts the process: "terminate called
    without an active exception"). A live daemon thread keeps its state; the device thread is
    waited for even when a hook on it made threading register it (a _DummyThread)."""
    r = run_python(
        "import ctypes, threading, time, torch\n"
        "from torch_neuronx import _registration\n"
        "api = ctypes.pythonapi\n"
        "api.PyInterpreterState_Get.restype = ctypes.c_void_p\n"
        "api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p\n"
        "api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]\n"
        "api.PyThreadState_Next.restype = ctypes.c_void_p\n"
        "api.PyThreadState_Next.argtypes = [ctypes.c_void_p]\n"
        "def states():\n"
        "    n, t = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())\n"
        "    while t:\n"
        "        n, t = n + 1, api.PyThreadState_Next(t)\n"
        "    return n\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "x = torch.ones(4, 4, device='neuron', requires_grad=True)\n"
        "x.register_hook(lambda g: threading.current_thread() and None)\n"
        "(x @ x).sum().backward()\n"
        "dummies = sum(isinstance(t, threading._DummyThread) for t in threading.enumerate())\n"
        "before = states()\n"
        "_registration._shutdown_autograd_threads()\n"
        "print(dummies, before, states())"
    )
    assert r.returncode == 0, r.stderr
    dummies, before, after = map(int, r.stdout.split())
    assert dummies == 1 and before > 2 and after == 2, r.stdout
