"""Pipeline, expert and context parallelism on neuron, alone and combined (TP x PP x FSDP,
CP x TP, with dropout on sharded activations), each checked against a single-core run of the
same seeded model and data (losses / outputs and gradients). The workers in ./workers run
under torchrun and state their tolerances."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import REPO, load_example, run_python, worker_env

WORKERS = Path(__file__).parent / "workers"


def torchrun(nproc, script, *args, timeout=600, findings=(), **env_extra):
    """torchrun `script` (a worker's name, or a path) on `nproc` ranks, under `torch-neuronx check`;
    returns its stdout. The check's comparison of the ranks' collectives must find nothing but what
    each of `findings` names: these correct layouts (pipeline schedules, expert and context
    parallelism, their combinations) are what it must not raise a false alarm on."""
    with tempfile.TemporaryDirectory() as report:
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", report, "--"]
        cmd += ["torchrun", "--standalone", f"--nproc_per_node={nproc}"]
        env = worker_env(**env_extra)
        env.pop("TORCH_DISTRIBUTED_DEBUG", None)
        p = subprocess.run(
            [*cmd, str(WORKERS / script), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
        )
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"{script} failed (rc {p.returncode}):\n{out[-6000:]}"
        across = json.loads((Path(report) / "report.json").read_text())["across_ranks"]
    assert len(across["findings"]) == len(findings) and len(across["ranks_compared"]) == nproc, across
    for f, what in zip(across["findings"], findings):
        assert what in f["message"], (what, f)
    return p.stdout


PP_SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
# Manual splits of every schedule, pipeline() tracing, and compiled stages.
PP_CASES = PP_SCHEDULES + [
    "GPipe:traced",
    "1F1B:traced",
    "1F1B:compile",
    "Interleaved1F1B:compile",
    "ZBVZeroBubble:compile",
]


def _check_cases(out, cases, nproc):
    for case in cases:
        assert out.count(f"CASE {case} OK") == nproc, f"{case}:\n{out[-4000:]}"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4], ids=["2proc", "4proc"])
def test_pipeline_schedules_match_single_core(nproc):
    out = torchrun(nproc, "pipeline_worker.py", ",".join(PP_CASES))
    _check_cases(out, PP_CASES, nproc)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pipeline_x_fsdp_2d_mesh_matches_single_core():
    out = torchrun(4, "pipeline_worker.py", "1F1B:fsdp,GPipe:fsdp")
    _check_cases(out, ["1F1B:fsdp", "GPipe:fsdp"], 4)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_pipeline_uneven_splits_fail_clearly():
    # the split the pipeline refuses, as its ranks exchanged it: found by the check too
    out = torchrun(2, "pipeline_worker.py", "bad_split", findings=["send #9 [2, 8, 32] float32"])
    _check_cases(out, ["bad_split"], 2)
    assert out.count("layers: ValueError: 8 layers do not split evenly into 3 pipeline stages") == 2, out
    msg = (
        "microbatches: ValueError: Number of microbatches (1) must be greater than or equal to the number of stages (2)"
    )
    assert out.count(msg) == 2, out
    # PyTorch splits a batch of 8 into microbatches of 3, 3, 2; the last stage's shapes were
    # inferred from the first microbatch, so its loss fails and the first stage times out.
    assert "Expected input batch_size (24) to match target batch_size (16)" in out, out


def test_pipeline_example_refuses_layers_that_do_not_divide_into_stages():
    example = load_example("pipeline")
    split, model = example.stage_module, example.Net(vocab=16, dim=8, layers=8)
    with pytest.raises(
        ValueError, match=r"^8 layers do not split evenly into 3 pipeline stages; use --layers a multiple"
    ):
        split(model, 0, 3)
    assert len(split(model, 1, 4).layers) == 2


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4], ids=["2proc", "4proc"])
def test_expert_parallel_moe_matches_single_core(nproc):
    out = torchrun(nproc, "moe_worker.py", "grouped,loop,bad_experts")
    _check_cases(out, ["grouped", "loop", "bad_experts"], nproc)
    n = 3 if nproc == 2 else 6
    msg = f"BAD_EXPERTS ValueError: {n} experts cannot be split evenly over {nproc} expert-parallel ranks"
    assert out.count(msg) == nproc, out
    assert "Split sizes doesn't match total dim 0 size" in out, out


CP_CASES = [
    "causal",
    "full",
    "causal:alltoall",
    "full:alltoall",
    "causal:bfloat16",
    "causal:gqa",
    "full:gqa",
    "causal:module",
    "full:module:alltoall",
    "mask",
    "bad_seq",
    "cpu_mesh",
]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4], ids=["2proc", "4proc"])
def test_context_parallel_sdpa_matches_single_core(nproc):
    out = torchrun(nproc, "cp_worker.py", ",".join(CP_CASES))
    _check_cases(out, CP_CASES, nproc)
    assert "context parallelism (ring attention) does not support attn_mask" in out, out
    for api in ("context_parallel", "_context_parallel_shard"):
        msg = (
            f"BAD_SEQ {api}: ValueError: context parallelism over {nproc} ranks needs sequence lengths that are "
            f"multiples of {nproc}, but buffer 0 has 31 positions along dim 2 (shape [2, 4, 31, 16])"
        )
        assert out.count(msg) == nproc, out


TP_ATTENTION_CASES = ["causal", "mask", "autocast", "compile", "heads", "batch", "gqa", "head_mask", "bad_mask"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_tensor_parallel_sdpa_on_dtensors_matches_single_core():
    out = torchrun(2, "tp_attention_worker.py", ",".join(TP_ATTENTION_CASES))
    _check_cases(out, TP_ATTENTION_CASES, 2)
    msg = (
        "BAD_MASK ValueError: aten._scaled_dot_product_flash_attention_for_cpu.default: attn_mask of shape "
        "[1, 8, 16, 16] placed (Shard(dim=2),) fits no sharding of query (shape [2, 8, 16, 8])"
    )
    assert out.count(msg) == 2, out


# Combined layouts (examples/layouts.py) on 2, 4 and 8 ranks; 8 ranks need 8 logical cores,
# a trn2.48xlarge's.
LAYOUTS = [
    (2, "cp_tp", "2x1"),
    (2, "pp_dp_tp", "2x1x1"),
    (4, "cp_tp", "2x2"),
    (4, "pp_dp_tp", "2x1x2"),
    (8, "pp_dp_tp", "2x2x2"),
    (8, "cp_tp", "4x2"),
]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc, layout, mesh", LAYOUTS, ids=[f"{lay}-{m}" for _, lay, m in LAYOUTS])
def test_combined_layouts_with_dropout_match_single_core(nproc, layout, mesh):
    example = REPO / "examples" / "layouts.py"
    out = torchrun(nproc, example, "--layout", layout, "--mesh", mesh, TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge")
    assert f"{layout} {mesh} on {nproc} ranks: losses and gradients equal one core's" in out, out


def test_context_parallel_hook_loads_lazily_and_only_acts_inside_context_parallel():
    code = """
import sys
import torch
CP = "torch.distributed.tensor.experimental._context_parallel._attention"
assert CP not in sys.modules, "import torch loaded context parallelism"
assert "torch.distributed.tensor" not in sys.modules, "import torch loaded DTensor"
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental._context_parallel import _attention, _sharding_rules
from torch_neuronx.distributed import context_parallel, sdpa_sharding
aten = torch.ops.aten
ops = [aten._scaled_dot_product_flash_attention_for_cpu.default,
       aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
assert all(op in _attention.custom_ops for op in ops)
handlers = lambda: DTensor._op_dispatcher._custom_op_handlers
propagator = DTensor._op_dispatcher.sharding_propagator
strategies = lambda: [propagator.op_strategy_funcs.get(op) for op in ops]
tp = [sdpa_sharding.forward_strategy, sdpa_sharding.backward_strategy]
cp = [context_parallel._fwd_strategy, context_parallel._bwd_strategy]
# Outside context parallelism: DTensor's tensor-parallel strategies, no ring handler.
assert strategies() == tp and not any(op in handlers() for op in ops), strategies()
_attention._enable_cp_dtensor_dispatcher()
assert strategies() == cp and all(op in handlers() for op in ops), strategies()
_attention._disable_cp_dtensor_dispatcher()
assert strategies() == tp and not any(op in handlers() for op in ops), strategies()
assert all(propagator.op_to_schema_info[op].static_kwargkey == ["attn_mask"] for op in ops)
assert _attention.__spec__.loader.get_source(CP)  # the module keeps its own loader
print("OK")
"""
    p = run_python(code, env=worker_env())
    assert p.returncode == 0 and p.stdout.strip() == "OK", p.stdout + p.stderr


@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_sdpa_on_head_sharded_dtensors_equals_one_cores_heads(device):
    # One process with PyTorch's fake process group, as rank 0 of 2: heads sharding needs no
    # collective. CPU meshes shard too (they raised "does not have a sharding strategy" before).
    code = f"""
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
mesh = init_device_mesh("{device}", (2,))
g = torch.Generator().manual_seed(0)
q, k, v, dout = (torch.randn(2, 4, 8, 16, generator=g).to("{device}") for _ in range(4))
ref = [t.clone().requires_grad_() for t in (q, k, v)]
ref_out = F.scaled_dot_product_attention(*ref, is_causal=True)
ref_out.backward(dout)
mine = [DTensor.from_local(t[:, :2].clone(), mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)]
out = F.scaled_dot_product_attention(*mine, is_causal=True)
out.backward(DTensor.from_local(dout[:, :2].clone(), mesh, [Shard(1)]))
for got, want in zip([out] + [t.grad for t in mine], [ref_out] + [t.grad for t in ref]):
    assert got.placements == (Shard(1),), got.placements
    assert torch.equal(got.to_local().cpu(), want[:, :2].detach().cpu())
print("OK")
"""
    p = run_python(code, env=worker_env())
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr


def test_context_parallel_refuses_a_sequence_the_ranks_do_not_divide():
    # One process with PyTorch's fake process group: the check runs before any collective.
    code = """
import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental._attention import _context_parallel_shard
mesh = init_device_mesh("neuron", (4,))
x = torch.randn(1, 30, 8, device="neuron")
msg = (r"^context parallelism over 4 ranks needs sequence lengths that are multiples of 4, but buffer 1 has 30 "
       r"positions along dim 1 \\(shape \\[1, 30, 8\\]\\), which would give the ranks shards of different lengths; "
       r"pad the sequence to a multiple of 4 \\(of 8 for causal load balancing\\)$")
with pytest.raises(ValueError, match=msg):
    _context_parallel_shard(mesh, [torch.zeros(2, 32, device="neuron"), x], [1, 1])
(shard,) = _context_parallel_shard(mesh, [torch.randn(1, 32, 8, device="neuron")], [1])
assert shard.shape == (1, 8, 8), shard.shape
# CPU meshes keep PyTorch's uneven sharding.
(shard,) = _context_parallel_shard(init_device_mesh("cpu", (4,)), [torch.randn(1, 30, 8)], [1])
assert shard.shape == (1, 8, 8), shard.shape
print("OK")
"""
    p = run_python(code, env=worker_env())
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr
