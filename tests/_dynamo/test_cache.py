"""Persistent compile cache: shared between processes, disable switch, location."""

import json
import os

import pytest

from helpers import run_python

_PROGRAM = r"""
import json, torch
from torch import nn
from torch._inductor import cpu_vec_isa
probes = []  # Inductor's vector-ISA probes: a child process each
_load = cpu_vec_isa.VecISA._probe_load
cpu_vec_isa.VecISA._probe_load = lambda self, path: probes.append(str(self)) or _load(self, path)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("neuron")
x = torch.randn(8, 16, device="neuron")
loss = torch.compile(model, backend="neuron")(x).pow(2).mean()
loss.backward()
m = torch.neuron.get_dynamo_metrics()
aot = torch._dynamo.utils.counters["aot_autograd"]
print(json.dumps({k: m[k] for k in ("graphs_compiled", "cache_hits", "cache_misses")}
                 | {"loss": loss.item(), "grad": model[0].weight.grad.sum().item(), "probes": len(probes),
                    "aot_hits": aot["autograd_cache_hit"], "aot_saved": aot["autograd_cache_saved"]}))
"""


def _run(env):
    r = run_python(_PROGRAM, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_process_hits_the_cache_unless_disabled(tmp_path):
    inductor_default = tmp_path.parent / f"{tmp_path.name}-inductor-default"
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(inductor_default)}
    cold = _run(env)
    warm = _run(env)
    assert cold["graphs_compiled"] == warm["graphs_compiled"] == 1
    assert cold["cache_misses"] == 1 and cold["cache_hits"] == 0
    assert warm["cache_hits"] == 1 and warm["cache_misses"] == 0
    # The whole forward+backward entry is kept in our cache and found by the next process
    # (none of it in Inductor's own cache directory), so a warm process compiles nothing.
    assert cold["aot_saved"] == 1 and warm["aot_hits"] == 1 and warm["aot_saved"] == 0
    assert not (inductor_default / "aotautograd").exists()
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]
    # Artifacts live under one versioned directory of the cache root.
    (versioned,) = os.listdir(tmp_path)
    assert versioned.startswith("torch-") and "neuronx-" in versioned
    # Whether this CPU's vector ISAs all build and load is probed once and kept: a warm
    # process does not probe them again (unless one failed, when Inductor must decide).
    with open(tmp_path / versioned / "vec_isa_verdicts.json") as f:
        (verdict,) = json.load(f).values()
    assert cold["probes"] > 0
    assert warm["probes"] < cold["probes"] if verdict else warm["probes"] == cold["probes"]
    before = _tree(tmp_path)

    # A warm cache is neither read nor written when the cache is disabled.
    off = _run(dict(env, TORCH_NEURONX_NEFF_DISABLE_CACHE="1"))
    assert off["graphs_compiled"] == 1 and off["cache_hits"] == 0 and off["cache_misses"] == 0
    assert off["loss"] == cold["loss"]
    assert _tree(tmp_path) == before


def _tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_default_cache_location(monkeypatch, tmp_path):
    from torch_neuronx._dynamo import cache

    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_root() == str(tmp_path / "torch_neuronx" / "neff")
    assert cache.cache_dir().startswith(str(tmp_path / "torch_neuronx" / "neff" / "torch-"))
