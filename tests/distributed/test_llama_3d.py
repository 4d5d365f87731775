"""examples/llama_3d.py: a Llama-3.1 model trained with TP x PP x DP (DTensor tensor and sequence
parallelism, torch.distributed.pipelining 1F1B, FSDP2), eager or with its decoder layers compiled, on
8 ranks gives the losses and gradient norms of the same model, data and seed on one core; and its
model is transformers' LlamaForCausalLM."""

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
    # key/value heads (as Llama-3.1-70B's 8 at TP=32), the example's ReplicatedKV style; and 2 x 2 x 2
    # with every decoder layer compiled (its DTensor tensor parallelism inside the compiled code).
    [(2, 2, 2, ()), (4, 2, 1, ()), (2, 2, 2, ("--compile",))],
    ids=["tp2-pp2-dp2", "tp4-pp2-dp1", "tp2-pp2-dp2-compiled"],
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
