"""Fidelity accounting of ops that are not native on Trainium."""

import warnings

import torch

import torch_neuronx
from helpers import run_python


def test_executed_ops_are_counted():
    torch_neuronx.clear_op_tracking()
    x = torch.ones(3, device="neuron")
    (x * 2).sum()
    ops = torch_neuronx.get_executed_ops()
    assert ops.get("aten::mul.Tensor") == 1
    assert sum(n for op, n in ops.items() if op.startswith("aten::sum")) == 1


def test_float64_is_recorded_and_warned_once():
    x = torch.ones(3, dtype=torch.float64).to("neuron")
    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x * 2
        x * 3
    msgs = [str(w.message) for w in caught if "CPU fallback" in str(w.message)]
    assert len(msgs) == 1  # once per op
    assert msgs[0].startswith(
        "Operator 'aten::mul.Tensor' executed via CPU fallback (float64 is not native on Trainium)"
    )
    assert torch_neuronx.get_fallback_ops() == {"aten::mul.Tensor": ["float64 is not native on Trainium"]}
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_fallback_ops() == {}


def test_native_dtypes_are_not_fallbacks():
    torch_neuronx.clear_op_tracking()
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool):
        torch.ones(2, dtype=dt, device="neuron").sum()
    x = torch.randn(3, 3, device="neuron")
    print(x)  # printing happens on the host
    assert torch_neuronx.get_fallback_ops() == {}


def test_complex_and_linalg_are_fallbacks():
    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ones(2, dtype=torch.complex64, device="neuron") * 2
        torch.linalg.qr(torch.randn(4, 4, device="neuron"))
    ops = torch_neuronx.get_fallback_ops()
    assert "aten::mul.Tensor" in ops and any("linalg_qr" in k for k in ops)


def test_strict_mode_raises():
    r = run_python(
        "import torch\n"
        "try:\n"
        "    torch.ones(2, dtype=torch.float64, device='neuron') * 2\n"
        "except RuntimeError as e:\n"
        "    print(e)\n",
        env={"TORCH_NEURONX_STRICT_FALLBACK": "1"},
    )
    assert "TORCH_NEURONX_STRICT_FALLBACK=1" in r.stdout and "aten::" in r.stdout, r.stderr
