"""Every ``module_db`` entry on neuron: CPU parity (forward, backward) and weights-only pickling.

For each ModuleInfo of PyTorch's ``module_db`` (RNN cells included), each
module input, in training and eval mode: the module built on CPU is copied to
neuron; outputs, input gradients and parameter gradients must equal CPU's.
The neuron module is then saved whole and loaded with the default
``weights_only=True``, allowlisting exactly the globals the CPU module needs;
the copy must give the same output.
"""

import copy
import importlib
import io

import pytest
import torch
import torch.utils._pytree as pytree
from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals
from torch.testing._internal.common_modules import module_db
from torch.testing._internal.common_utils import freeze_rng_state

TOL = dict(rtol=1e-4, atol=1e-5)


def _to_neuron(obj):
    moved = {}  # one copy per tensor: a sample may pass the same tensor twice

    def move(t):
        if id(t) not in moved:
            moved[id(t)] = t.detach().to("neuron").requires_grad_(t.requires_grad)
        return moved[id(t)]

    return pytree.tree_map_only(torch.Tensor, move, obj)


def _forward_backward(module, args, kwargs):
    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    for t in inputs:
        t.retain_grad()  # inputs the samples derive from a leaf have gradients too
    with freeze_rng_state():
        out = module(*args, **kwargs)
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    diff = [t for t in outs if t.requires_grad]
    if diff:
        torch.manual_seed(3)
        grads = [torch.randn(t.shape, dtype=t.dtype).to(t.device) for t in diff]
        torch.autograd.backward(diff, grads)
    return outs, [t.grad for t in inputs], [p.grad for p in module.parameters()]


def _assert_close(neuron, cpu):
    assert len(neuron) == len(cpu)
    for a, b in zip(neuron, cpu):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a.cpu(), b, equal_nan=True, **TOL)


def _resolve(name):
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _saved(module):
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return buf


# Eval-mode nn.Transformer takes the nested-tensor fast path (padding masks), and
# nested tensors have no neuron kernels yet.
NESTED = {("nn.Transformer", False)}


@pytest.mark.slow
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("info", module_db, ids=lambda m: m.formatted_name)
def test_module_parity_and_pickle(info, training):
    if torch.float32 not in info.dtypes:
        pytest.skip("no float32")
    if (info.name, training) in NESTED:
        pytest.skip("nested tensors are not supported on neuron")
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True, training=training)
    for mi in inputs:
        if mi.forward_input is None:
            continue
        torch.manual_seed(0)
        cpu = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs).to(torch.float32)
        cpu.train(training)
        args, kwargs = mi.forward_input.args, mi.forward_input.kwargs
        if isinstance(cpu, torch.nn.modules.lazy.LazyModuleMixin):
            with torch.no_grad(), freeze_rng_state():
                cpu(*args, **kwargs)  # materialize on CPU, so both copies start from the same weights
        neuron = copy.deepcopy(cpu).to("neuron")
        n_args, n_kwargs = _to_neuron((args, kwargs))
        expected = _forward_backward(cpu, args, kwargs)
        got = _forward_backward(neuron, n_args, n_kwargs)
        for g, e in zip(got, expected):
            _assert_close(g, e)

        # Whole-module pickle, weights-only: the neuron checkpoint needs CPU's allowlist, no more.
        needed = get_unsafe_globals_in_checkpoint(_saved(cpu))
        saved = _saved(neuron)
        assert get_unsafe_globals_in_checkpoint(saved) == needed
        saved.seek(0)
        with safe_globals([_resolve(n) for n in needed]):
            copy_ = torch.load(saved)
        assert all(p.device.type == "neuron" for p in copy_.parameters())
        with torch.no_grad(), freeze_rng_state():
            reloaded = pytree.tree_leaves(copy_(*n_args, **n_kwargs))
        with torch.no_grad(), freeze_rng_state():
            direct = pytree.tree_leaves(neuron(*n_args, **n_kwargs))
        for a, b in zip(reloaded, direct):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)
