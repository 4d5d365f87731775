"""Real compiler faults: a broken C++ compiler, unwritable and corrupted compile caches."""

import glob
import json
import os
import subprocess

import pytest

from helpers import run_python

# Compiles a small MLP (forward + backward) and prints what happened as JSON.
_PROGRAM = r"""
import json, sys, warnings, torch
from torch import nn
fallback = sys.argv[1] == "fallback"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
x = torch.randn(8, 16)
expected = model(x).pow(2).mean().item()
model.to("neuron")
result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        compiled = torch.compile(model, backend="neuron", options={"fallback_execution": fallback})
        loss = compiled(x.to("neuron")).pow(2).mean()
        loss.backward()
        # a second graph failing for the same cause must not warn again
        torch.compile(lambda t: t * 3 + 1, backend="neuron",
                      options={"fallback_execution": fallback})(x.to("neuron"))
        result["loss"], result["expected"] = loss.item(), expected
    except Exception as e:
        result["error"] = type(e).__name__
        result["message"] = str(e)
m = torch.neuron.get_dynamo_metrics()
result["warnings"] = [str(w.message) for w in caught if "neuron" in str(w.message)]
result.update({k: m[k] for k in ("graphs_compiled", "cache_hits", "cache_misses", "fallbacks", "cache_discarded")})
print(json.dumps(result))
"""


def _run(cache_dir, fallback=False, **env):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(cache_dir), **env}
    r = run_python(_PROGRAM.replace("sys.argv[1]", repr("fallback" if fallback else "raise")), env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_broken_compiler_raises_naming_the_cause(tmp_path):
    out = _run(tmp_path, fallback=False, CXX="/bin/false")
    assert out["error"] == "NeuronGraphCompilationError"
    assert "InvalidCxxCompiler" in out["message"] and "/bin/false" in out["message"]
    assert "fallback_execution" in out["message"]


@pytest.mark.slow
def test_broken_compiler_falls_back_eagerly_warning_once(tmp_path):
    out = _run(tmp_path, fallback=True, CXX="/bin/false")
    assert "error" not in out, out
    assert out["loss"] == pytest.approx(out["expected"], rel=1e-5)
    assert len(out["fallbacks"]) == 2 and out["graphs_compiled"] == 0
    assert all("InvalidCxxCompiler" in f["error"] for f in out["fallbacks"])
    (warning,) = [w for w in out["warnings"] if "failed to compile" in w]
    assert "InvalidCxxCompiler" in warning and "running it eagerly" in warning


def _immutable(path) -> bool:
    # Tests run as root, which ignores permission bits; the immutable attribute
    # stops root too (where the file system supports it).
    return subprocess.run(["chattr", "-R", "+i", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["under_a_regular_file", pytest.param("immutable_directory", marks=pytest.mark.slow)])
def test_unwritable_cache_compiles_without_persisting(tmp_path, kind):
    if kind == "under_a_regular_file":
        (tmp_path / "file").write_text("")
        cache_dir = tmp_path / "file" / "cache"
    else:
        cache_dir = tmp_path / "ro"
        cache_dir.mkdir()
        if not _immutable(cache_dir):
            pytest.skip("chattr +i is not available here")
    try:
        out = _run(cache_dir)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(tmp_path)], capture_output=True)
    assert "error" not in out, out
    assert out["loss"] == pytest.approx(out["expected"], rel=1e-5)
    assert out["graphs_compiled"] == 2 and out["cache_hits"] == out["cache_misses"] == 0
    (warning,) = [w for w in out["warnings"] if "not writable" in w]
    assert "compiling without persisting" in warning and str(cache_dir) in warning


@pytest.mark.slow
def test_corrupted_cache_entries_are_discarded_and_recompiled(tmp_path):
    cold = _run(tmp_path)
    assert cold["cache_misses"] == 2 and not cold["cache_discarded"]

    libraries = glob.glob(str(tmp_path / "*" / "??" / "*.so"))
    graphs = [p for p in glob.glob(str(tmp_path / "*" / "fxgraph" / "**"), recursive=True) if os.path.isfile(p)]
    assert libraries and graphs
    for path in libraries + graphs:  # truncated entries, as after a full disk or a killed copy
        with open(path, "rb") as f:
            head = f.read(64)
        with open(path, "wb") as f:
            f.write(head)
    stray = os.path.join(os.path.dirname(graphs[0]), "garbage")  # an entry no compile wrote
    with open(stray, "w") as f:
        f.write("garbage")

    warm = _run(tmp_path)
    assert "error" not in warm, warm
    assert warm["loss"] == cold["loss"]
    assert warm["cache_hits"] == 0 and warm["cache_misses"] == 2
    assert len(warm["cache_discarded"]) == len(libraries) + len(graphs) + 1
    assert any("garbage" in d and "not written by a neuron compile" in d for d in warm["cache_discarded"])
    (warning,) = [w for w in warm["warnings"] if "corrupted compile-cache" in w]
    assert "recompiled" in warning
    assert not os.path.exists(stray)

    again = _run(tmp_path)  # the recompiled entries are whole: a clean hit
    assert again["cache_hits"] == 2 and not again["cache_discarded"] and again["loss"] == cold["loss"]
