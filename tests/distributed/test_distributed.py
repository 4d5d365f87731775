"""torch.distributed on neuron: c10d backend "neuron", collectives (with NCCL's argument
rules), DDP, FSDP2, tensor/sequence parallel, FSDP x TP, DCP, transformers
DistributedConfig, accelerate launch, examples/sft.py on 32 ranks, on two torchrun
"nodes" and compiled with activation checkpointing, and faults. Multi-process checks run under torchrun (or
plain processes for the fault tests) from the workers in ./workers."""

import datetime
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import worker_env

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[2]


def _env():
    env = worker_env()
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    return env


def torchrun(nproc, script, *args, timeout=300, env=None):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(WORKERS / script),
        *map(str, args),
    ]
    p = subprocess.run(cmd, env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{script} failed (rc {p.returncode}):\n{out[-6000:]}"
    return p.stdout


def torchrun_nodes(nnodes, nproc_per_node, script, *args, timeout=600, env=None):
    """`nnodes` torchrun invocations on this machine (--nnodes/--node-rank, one rendezvous
    endpoint on localhost), as a multi-node job runs one per host; returns their outputs."""
    endpoint = f"localhost:{_free_port()}"
    procs = []
    for node in range(nnodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--node-rank={node}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={endpoint}",
            str(script),
            *map(str, args),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env={**_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node} of {script} failed (rc {p.returncode}):\n{out[-6000:]}"
    return outs


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# In-process (world size 1)


@pytest.fixture
def single_rank_group():
    store = dist.HashStore()
    dist.init_process_group("neuron", rank=0, world_size=1, store=store, timeout=datetime.timedelta(seconds=30))
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_backend_registration():
    assert dist.Backend.NEURON == "neuron"
    assert dist.Backend.backend_capability["neuron"] == ["neuron", "cpu"]
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # CPU's default untouched
    dump = torch._C._dispatch_dump("c10d::allreduce_")
    pu1 = [line for line in dump.splitlines() if line.startswith("PrivateUse1")][0]
    assert "collectives.cpp" in pu1, pu1


def test_single_rank_group_uses_one_gloo_for_both_devices(single_rank_group):
    pg = single_rank_group
    assert dist.get_backend() == "neuron"
    cpu_b, neuron_b = pg._get_backend(torch.device("cpu")), pg._get_backend(torch.device("neuron"))
    assert cpu_b.name() == "gloo" and neuron_b.name() == "gloo"
    assert cpu_b is neuron_b or cpu_b._get_backend_name() == neuron_b._get_backend_name()
    x = torch.arange(6, dtype=torch.float32, device="neuron")
    ptr = x.data_ptr()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    assert x.device.type == "neuron" and x.data_ptr() == ptr
    assert torch.equal(x.cpu(), torch.arange(6, dtype=torch.float32))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    assert torch.equal(x.cpu(), torch.arange(6, dtype=torch.float32) * 2)
    w = dist.all_reduce(x, async_op=True)
    (v,) = w.get_future().wait()
    assert v.device.type == "neuron" and v.data_ptr() == ptr
    dist.barrier(device_ids=[0])


def test_a_collectives_future_runs_callbacks_in_the_callers_thread_and_modes(single_rank_group):
    # As NCCL's: a DDP comm hook's then() callbacks (fp16 decompression, PowerSGD's matmuls and
    # all-reduces) run where they are added, seen by the caller's dispatch modes (profilers,
    # readiness recordings) and under its autocast and grad mode, not on gloo's thread.
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((str(func), threading.current_thread() is threading.main_thread()))
            return func(*args, **(kwargs or {}))

    x = torch.ones(4, device="neuron")
    with Seen():
        fut = dist.all_reduce(x, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert doubled.device.type == "neuron" and torch.equal(doubled.cpu(), torch.full((4,), 2.0))
    assert seen == [("c10d.allreduce_.default", True), ("aten.mul.Tensor", True)], seen


def test_ddp_collects_time_stats_on_neuron(single_rank_group):
    # DDP's reducer times iterations with the timer registered for its parameters' device;
    # without one it warned "only collected for CPU and CUDA" and reported no times.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).to("neuron"))
    for _ in range(2):
        model(torch.randn(2, 4, device="neuron")).sum().backward()
    stats = model._get_ddp_logging_data()
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert stats.get(key, 0) > 0, (key, stats.get(key))


def test_mixed_devices_raise_clear_error(single_rank_group):
    # The argument rules and wording of ATen ops, except that a collective sends or
    # receives every tensor: a 0-dim CPU tensor is no scalar operand there, and the
    # error says how to fix it.
    for out in (torch.empty(2), torch.tensor(0.0)):
        with pytest.raises(
            RuntimeError,
            match=re.escape(
                "Expected all tensors to be on the same device, but got output_tensors is on cpu, different from "
                "other tensors on neuron:0 (when checking argument in method c10d::allgather_). A collective "
                "sends or receives every tensor it is given on one device: move the tensor with .to('neuron') "
                "(or run the whole collective on CPU tensors)"
            ),
        ):
            dist.all_gather([out], torch.ones(out.shape, device="neuron"))


def test_group_without_cpu_backend_still_works():
    # init_process_group() without a backend maps only the accelerator (neuron).
    dist.init_process_group("neuron:neuron", rank=0, world_size=1, store=dist.HashStore())
    try:
        assert [d.type for d in dist.group.WORLD._device_types] == ["neuron"]
        x = torch.ones(3, device="neuron")
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.ones(3))
    finally:
        dist.destroy_process_group()


_FREED_UNDER_THE_GIL = """
import tempfile, time, torch, torch.distributed as dist
dist.init_process_group("neuron", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
reducer = dist.Reducer([torch.nn.Parameter(torch.ones(4, device="neuron"))], [[0]], [1 << 20], dist.group.WORLD)
def slow(fut):
    time.sleep(0.5)  # without the GIL: the main thread tears the group down meanwhile
    return fut.value()
fut = dist.all_reduce(torch.ones(4, device="neuron"), async_op=True).get_future().then(slow)
time.sleep(0.1)
dist.destroy_process_group()
del reducer  # DDP's reducer frees the last C++ reference to the group while holding the GIL
print("freed", flush=True)
assert fut.wait()[0].device.type == "neuron"
"""


def test_group_freed_by_cpp_under_the_gil_does_not_hang():
    # gloo's destructor joins its workers; one still running a collective's callback
    # needs the GIL. The backend's last reference is a Python one, released without the GIL.
    p = subprocess.run(
        [sys.executable, "-c", _FREED_UNDER_THE_GIL], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout == "freed\n", p.stderr[-2000:]


# ---------------------------------------------------------------------------
# torchrun


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc,bind", [(2, False), (4, True)], ids=["2proc", "4proc-device_id"])
def test_collectives(nproc, bind):
    out = torchrun(nproc, "collectives_worker.py", env={"NEURON_TEST_BIND_DEVICE": "1" if bind else "0"})
    assert out.count("CHECKS PASSED") == nproc, out


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("nproc,debug", [(2, "OFF"), (4, "DETAIL")], ids=["2proc", "4proc-DETAIL"])
def test_collectives_accept_nccl_shapes_and_check_layouts(nproc, debug):
    out = torchrun(nproc, "shapes_worker.py", env={"TORCH_DISTRIBUTED_DEBUG": debug})
    assert out.count("SHAPES PASSED") == nproc, out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ddp_fsdp2_tp_dcp_match_single_process(tmp_path):
    modes = ["ddp", "ddp_hooks", "fsdp2", "fsdp2_bf16", "tp", "tp_sp", "dcp"]
    out = torchrun(2, "train_worker.py", ",".join(modes), tmp_path / "ckpt")
    for m in modes:
        assert out.count(f"MODE {m} OK") == 2, out
    assert (tmp_path / "ckpt" / ".metadata").exists()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fsdp_x_tp_2d_mesh_matches_single_process():
    out = torchrun(4, "train_worker.py", "fsdp_tp")
    assert out.count("MODE fsdp_tp OK") == 4, out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_nodes_ddp_and_fsdp_x_tp_match_single_process():
    """Two torchrun "nodes" of 2 ranks, each its own simulated trn2.3xlarge."""
    outs = torchrun_nodes(2, 2, WORKERS / "train_worker.py", "nodes,ddp,fsdp_tp")
    for node, out in enumerate(outs):
        for mode in ("nodes", "ddp", "fsdp_tp"):
            assert out.count(f"MODE {mode} OK") == 2, f"node {node}:\n{out[-4000:]}"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_nodes_sft_example_tp2_fsdp2(tmp_path):
    """examples/sft.py with TP inside a node and FSDP across the two nodes."""
    from torch_neuronx.demo.hf import build_base_checkpoint

    base = build_base_checkpoint(str(tmp_path / "base"))
    outs = torchrun_nodes(2, 2, WORKERS / "sft_mesh_worker.py", 2, 2, base, tmp_path / "out", 3, timeout=900)
    assert "SFT MESH OK tp=2 fsdp=2" in outs[0], outs[0][-4000:]
    mem = [line for line in outs[0].splitlines() if line.startswith("MEM rank")]
    assert [line.split()[4] for line in mem] == ["0", "0", "1", "1"], mem  # node of each rank


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sft_example_tp4_fsdp8_32_ranks_on_trn2_48xlarge(tmp_path):
    """A full trn2.48xlarge (64 logical cores at LNC=2): 32 ranks, TP 4 x FSDP 8, bf16,
    packed, padded to 128; the checkpoint reloads on CPU with the sharded model's logits.
    Prints each rank's host memory."""
    from torch_neuronx.demo.hf import build_base_checkpoint

    base = build_base_checkpoint(str(tmp_path / "base"))
    out = torchrun(
        32,
        "sft_mesh_worker.py",
        4,
        8,
        base,
        tmp_path / "out",
        3,
        timeout=1200,
        env={"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge"},
    )
    mem = [line for line in out.splitlines() if line.startswith(("MEM", "SFT MESH"))]
    print("\n".join(mem))
    assert "SFT MESH OK tp=4 fsdp=8" in out, out[-4000:]
    peaks = [int(line.rsplit("peak_rss=", 1)[1]) for line in mem if line.startswith("MEM rank")]
    assert len(peaks) == 32 and max(peaks) < 1024, peaks  # MiB per rank


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compiled_full_checkpointing_of_a_tp_layer_fails_upstream_selective_matches_eager():
    """torch 2.13 cannot compile full activation checkpointing of a TP layer that holds a
    random-tagged op (SDPA); a selective policy that saves SDPA compiles and matches eager."""
    out = torchrun(2, "checkpoint_mesh_worker.py", timeout=300)
    assert "CHECKPOINT MESH OK" in out, out[-4000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sft_example_tp2_fsdp2_compiled_with_selective_checkpointing(tmp_path):
    """examples/sft.py, TP 2 x FSDP 2, compiled with backend "neuron", every decoder layer
    checkpointed through TRL's selective policy (the documented way to combine
    DistributedConfig, torch_compile and activation checkpointing)."""
    from torch_neuronx.demo.hf import build_base_checkpoint

    base = build_base_checkpoint(str(tmp_path / "base"))
    options = ["--torch_compile", "true", "--activation_checkpointing", "true"]
    options += ["--activation_checkpointing_kwargs", '{"selective": true}']
    out = torchrun(4, "sft_mesh_worker.py", 2, 2, base, tmp_path / "out", 3, *options, timeout=600)
    assert "SFT MESH OK tp=2 fsdp=2 checkpointing selective" in out, out[-4000:]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_llama")
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.multiprocess
@pytest.mark.slow
def test_transformers_distributed_config_tp2_fsdp2(tiny_llama_dir):
    out = torchrun(4, "hf_worker.py", tiny_llama_dir)
    assert out.count("HF DistributedConfig OK") == 4, out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_accelerate_launch_multi_neuron():
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(WORKERS / "accelerate_worker.py"),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert p.stdout.count("ACCELERATE OK") == 2, p.stdout


# ---------------------------------------------------------------------------
# Faults: plain processes (torchrun would tear the survivors down itself).


def _launch_fault(scenario, timeout_s, world=2, extra_env=None):
    port = _free_port()
    procs = []
    for r in range(world):
        env = _env()
        env.update(
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        env.update(extra_env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / "fault_worker.py"), scenario, str(timeout_s)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=180)[0] for p in procs]
    return [p.returncode for p in procs], outs


def _failure_time(out):
    line = [l for l in out.splitlines() if "FAILED-AS-EXPECTED" in l]
    assert line, out[-4000:]
    return float(line[0].split("FAILED-AS-EXPECTED")[1].split()[0]), line[0]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_killed_rank_makes_survivor_fail_clearly():
    rcs, outs = _launch_fault("kill", 20)
    assert rcs[1] == -9
    assert rcs[0] == 3, outs[0][-4000:]
    dt, line = _failure_time(outs[0])
    assert dt < 20
    assert "CollectiveTimeoutError" in line and "connection closed" in line and "ranks [1] did not arrive" in line, line


@pytest.mark.multiprocess
@pytest.mark.slow
def test_hung_peer_times_out_within_pg_timeout():
    rcs, outs = _launch_fault("hang", 5)
    assert rcs[0] == 3, outs[0][-4000:]
    dt, line = _failure_time(outs[0])
    assert 4 <= dt < 15, line
    assert "Timed out" in line or "timeout" in line.lower(), line


@pytest.mark.multiprocess
@pytest.mark.slow
def test_mismatched_shapes_fail_not_hang():
    # The check before each collective (TORCH_NEURONX_CHECK_COLLECTIVES=2): every rank raises
    # a typed error naming both shapes (gloo alone would abort the receiving rank: "Received
    # data size doesn't match expected size"; by default the survivor names both, test_hangs.py).
    rcs, outs = _launch_fault("mismatch", 20, extra_env={"TORCH_NEURONX_CHECK_COLLECTIVES": "2"})
    assert rcs == [3, 3], rcs
    for out in outs:
        _, line = _failure_time(out)
        assert "CollectiveMismatchError" in line and "1024" in line and "4096" in line, line
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: every rank raises a typed error naming both shapes.
    rcs, outs = _launch_fault("mismatch", 20, extra_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert rcs == [3, 3], rcs
    for out in outs:
        _, line = _failure_time(out)
        assert "Detected mismatch between collectives" in line, line
