"""examples/llama_3d.py: a Llama-3.1 model trained with TP x PP x DP (DTensor tensor and sequence
parallelism, torch.distributed.pipelining 1F1B, FSDP2), eager or with its decoder layers compiled, on
8 ranks gives the losses and gradient norms of the same model, data and seed on one core; its
checkpointing modes recompute what they say; and its model is transformers' LlamaForCausalLM."""

import json
import re
import subprocess
import sys

import pytest
import torch

from helpers import REPO, load_example, worker_env

EXAMPLE = REPO / "examples" / "llama_3d.py"
# A tiny Llama-3.1 (GQA with 2 key/value heads, RoPE with Llama 3.1's scaling, SwiGLU, RMSNorm), fp32
# so that the layouts differ only in the order of float32 sums.
TINY = ["--config", "tiny", "--seq", "32", "--global-batch", "8", "--micro-batch", "1", "--steps", "3"]
TINY += ["--lr", "1e-3", "--precision", "fp32"]
STEP = re.compile(r"^step (\d+)/\d+  loss ([\d.]+)  grad norm ([\d.]+)", re.M)
# Measured: at most one float32 ulp of the loss (4.8e-7 at 5.6) and 1.2e-7 in the gradient norm.
RTOL, ATOL = 1e-5, 1e-6


def _run(nproc, tp, pp, dp, *extra):
    """The example under torchrun; its (loss, grad norm) per step, as the last stage printed them."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += [str(EXAMPLE), *TINY, "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), *extra]
    env = worker_env(TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge")  # 8 ranks need 8 cores; the default has 4
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    # Generous: 8 ranks share this machine's cores with whatever else runs (about 90 s at load 15).
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"llama_3d.py {tp}x{pp}x{dp} failed (rc {p.returncode}):\n{out[-6000:]}"
    steps = [(float(loss), float(norm)) for _, loss, norm in STEP.findall(p.stdout)]
    assert len(steps) == 3, p.stdout
    return steps


@pytest.fixture(scope="module")
def one_core():
    return _run(1, 1, 1, 1)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "tp, pp, dp, extra",
    # 2 x 2 x 2: the key/value heads split over tp as the query heads do; 4 x 2 x 1: more tp ranks than
    # key/value heads (as Llama-3.1-70B's 8 at TP=32), the example's ReplicatedKV style, with selective
    # checkpointing (AWS's); and 2 x 2 x 2 with every decoder layer compiled (its DTensor tensor
    # parallelism inside the compiled code). The others checkpoint whole layers.
    [(2, 2, 2, ()), (4, 2, 1, ("--checkpointing", "selective")), (2, 2, 2, ("--compile",))],
    ids=["tp2-pp2-dp2", "tp4-pp2-dp1-selective", "tp2-pp2-dp2-compiled"],
)
def test_llama_3d_losses_equal_one_core(one_core, tp, pp, dp, extra):
    steps = _run(tp * pp * dp, tp, pp, dp, *extra)
    for i, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(steps, one_core)):
        assert loss == pytest.approx(ref_loss, rel=RTOL, abs=ATOL), (i, steps, one_core)
        assert norm == pytest.approx(ref_norm, rel=RTOL, abs=ATOL), (i, steps, one_core)
    # The model learns: the three steps do not give one loss.
    assert len({loss for loss, _ in steps}) > 1, steps


def test_llama_3d_model_is_transformers_llama():
    """The example's model with its seeded weights, loaded into transformers' LlamaForCausalLM (the
    same module names under "model."), gives the same logits on CPU: GQA, Llama 3.1's RoPE scaling,
    SwiGLU and RMSNorm as transformers implements them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ex = load_example("llama_3d")
    cfg = LlamaConfig(**ex.PRESETS["tiny"])
    assert cfg.rope_parameters["rope_type"] == "llama3"
    model = ex.Llama(cfg, seq_len=32)
    ex.init_weights(model, cfg, seed=0)
    hf = LlamaForCausalLM(cfg).eval()
    state = {k if k.startswith("lm_head.") else f"model.{k}": v for k, v in model.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    x = torch.randint(cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, rtol=1e-5, atol=1e-5)


# One decoder layer of the tiny model at TP=2 with sequence parallelism, a fake process group of two
# ranks in a fresh interpreter (a process group of its own): the calls of the matmuls, attention and
# sequence collectives in its forward and in its backward, per --checkpointing mode.
_COUNT = """
import json, sys, torch
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig
sys.path.insert(0, sys.argv[1])
from helpers import load_example

PATTERNS = {"mm": "mm", "attention": "_scaled_dot_product_flash_attention_for_cpu",
            "all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = dict.fromkeys(PATTERNS, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for key, name in PATTERNS.items():
            self.calls[key] += func.overloadpacket.__name__ == name
        return func(*args, **(kwargs or {}))

ex = load_example("llama_3d")
cfg = LlamaConfig(**ex.PRESETS["tiny"])
torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
out = {}
for mode in ("full", "selective", "none"):
    model = ex.Llama(cfg, seq_len=32)
    model.embed_tokens = model.lm_head = model.norm = None
    del model.layers["1"], model.layers["2"], model.layers["3"]
    ex.apply_tp(model, mesh, cfg)
    ex.init_weights(model, cfg, seed=0)
    ex.apply_checkpointing(model, mode)
    x = torch.randn(1, 16, cfg.hidden_size, requires_grad=True)  # this rank's half of 32 positions
    forward, backward = Count(), Count()
    with forward:
        y = model(x)
    with backward:
        y.sum().backward()
    out[mode] = [forward.calls, backward.calls]
torch.distributed.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def recomputation():
    r = subprocess.run([sys.executable, "-c", _COUNT, str(REPO / "tests")], capture_output=True, text=True,
                       env=worker_env(), timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "mode, recomputed",
    # per layer, in the backward: "full" runs the layer's forward again up to its last saved input (all but
    # down_proj's matmul); "selective" keeps q, k, v, gate and up, and recomputes the sequence all-gathers and
    # attention's core, stopping before o_proj and down_proj, whose outputs (partial sums) it does not keep.
    [("full", {"mm": 6, "attention": 1, "all_gather": 2, "reduce_scatter": 1}),
     ("selective", {"mm": 0, "attention": 1, "all_gather": 2, "reduce_scatter": 0}),
     ("none", {"mm": 0, "attention": 0, "all_gather": 0, "reduce_scatter": 0})],
)  # fmt: skip
def test_llama_3d_checkpointing_recomputes_what_its_mode_says(recomputation, mode, recomputed):
    """One decoder layer at TP=2 with sequence parallelism: the ops its backward runs again, per
    --checkpointing mode."""
    forward, backward = recomputation[mode]
    # the forward: q, k, v, o, gate, up, down; two gathers and two reduce-scatters around attention and MLP
    assert forward == {"mm": 7, "attention": 1, "all_gather": 2, "reduce_scatter": 2}
    # the backward's own: two matmuls per projection, attention's backward, the collectives' adjoints
    own = {"mm": 14, "attention": 0, "all_gather": 2, "reduce_scatter": 2}
    assert backward == {k: own[k] + recomputed[k] for k in own}
